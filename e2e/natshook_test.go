package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metabus/metabus/pkg/allinone"
)

// natsReplica is one hook process serving a controller's hooks over NATS:
// its own connection, one queue subscription per hook subject, and a count
// of the calls it answered.
type natsReplica struct {
	nc    *nats.Conn
	calls atomic.Int64
}

// serveNATSHooks starts a replica answering each subject of hooks (subject
// to a JSON handler) in the queue group queue.
func serveNATSHooks(t *testing.T, url, queue string, hooks map[string]func(req map[string]any) (int, any)) *natsReplica {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	r := &natsReplica{nc: nc}
	for subject, h := range hooks {
		count := func(req map[string]any) (int, any) { r.calls.Add(1); return h(req) }
		if _, err := nc.QueueSubscribe(subject, queue, natsJSONHook(count)); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return r
}

// natsJSONHook adapts a function of the decoded request to a hook served
// over NATS, as jsonHook does for HTTP: a request that is not JSON gets a
// 400 error answer (hookwire's Nats-Service-Error-Code).
func natsJSONHook(f func(req map[string]any) (int, any)) nats.MsgHandler {
	return func(m *nats.Msg) {
		var req map[string]any
		if err := json.Unmarshal(m.Data, &req); err != nil {
			answer := nats.NewMsg(m.Reply)
			answer.Header.Set("Nats-Service-Error-Code", "400")
			answer.Header.Set("Nats-Service-Error", err.Error())
			_ = m.RespondMsg(answer)
			return
		}
		_, resp := f(req)
		data, _ := json.Marshal(resp)
		_ = m.Respond(data)
	}
}

// TestNATSHooksQueueGroup: a CompositeController whose sync, finalize and
// customize hooks are served over NATS by two replicas in one queue group.
// One replica is closed while parents are being synced: nothing is lost,
// every parent converges on the other one, and deleting the parents runs
// the finalize hook, which releases them.
func TestNATSHooksQueueGroup(t *testing.T) {
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	prefix := "hooks.e2e." + ns + "."
	hooks := map[string]func(map[string]any) (int, any){
		prefix + "sync": widgetHook(nil),
		prefix + "finalize": func(map[string]any) (int, any) {
			return 200, map[string]any{"children": []any{}, "finalized": true}
		},
		prefix + "customize": func(map[string]any) (int, any) {
			return 200, map[string]any{"relatedResources": []any{}}
		},
	}
	a := serveNATSHooks(t, inst.url, "widgets", hooks)
	b := serveNATSHooks(t, inst.url, "widgets", hooks)
	natsHook := func(kind string) map[string]any {
		return map[string]any{"nats": map[string]any{"subject": prefix + kind, "timeout": "2s"}}
	}
	createController(t, inst, compositeKind, "widgets-nats-"+ns, map[string]any{
		"parentResource": map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets"},
		"childResources": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": map[string]any{"method": "InPlace"}}},
		"hooks":          map[string]any{"sync": natsHook("sync"), "finalize": natsHook("finalize"), "customize": natsHook("customize")},
	})

	const parents = 16
	for i := range parents {
		if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, newWidget(fmt.Sprintf("w%02d", i), []string{"a", "b"}, 1), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if i == parents/2 {
			// Mid-run: once replica a has answered calls, it goes away.
			eventually(t, 30*time.Second, "replica a answering calls", func() error {
				if a.calls.Load() < 2 {
					return fmt.Errorf("replica a answered %d calls", a.calls.Load())
				}
				return nil
			})
			a.nc.Close()
		}
	}
	eventually(t, 90*time.Second, "every parent's children", func() error {
		for i := range parents {
			name := fmt.Sprintf("w%02d", i)
			got, err := configMapNames(ctx, ns, name)
			if err != nil {
				return err
			}
			if want := []string{name + "-a", name + "-b"}; strings.Join(got, ",") != strings.Join(want, ",") {
				return fmt.Errorf("%s has children %v, want %v", name, got, want)
			}
		}
		return nil
	})
	beforeDelete := b.calls.Load()
	if a.calls.Load() == 0 || beforeDelete == 0 {
		t.Errorf("calls answered: replica a %d, replica b %d; want both to have served", a.calls.Load(), beforeDelete)
	}
	for i := range parents {
		if err := dyn.Resource(widgetsGVR).Namespace(ns).Delete(ctx, fmt.Sprintf("w%02d", i), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 60*time.Second, "every parent finalized and gone", func() error {
		list, err := dyn.Resource(widgetsGVR).Namespace(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if n := len(list.Items); n > 0 {
			return fmt.Errorf("%d parents left, e.g. %s with finalizers %v", n, list.Items[0].GetName(), list.Items[0].GetFinalizers())
		}
		return nil
	})
	if b.calls.Load() == beforeDelete {
		t.Error("the finalize hook was never called over NATS")
	}
	t.Logf("calls answered: replica a %d (closed mid-run), replica b %d", a.calls.Load(), b.calls.Load())
}

// TestNATSHookFailures: a NATS hook that hangs, answers garbage or is
// absent fails the sync as the HTTP equivalent does (a SyncError Event on
// the parent saying why, retried with backoff); only the absent hook's
// message differs, naming the subject nobody serves. A subject on the bus
// is refused, nothing sent.
func TestNATSHookFailures(t *testing.T) {
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	nc, err := nats.Connect(inst.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	prefix := "hooks.e2e." + ns + "."
	var garbageCalls atomic.Int64
	if _, err := nc.Subscribe(prefix+"hang", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Subscribe(prefix+"garbage", func(m *nats.Msg) { garbageCalls.Add(1); _ = m.Respond([]byte("<html>oops")) }); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	hang := hookServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	}))
	garbage := hookServer(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte("<html>oops"))
	}))
	for _, tc := range []struct {
		name      string
		nats, web map[string]any
	}{
		{name: "hang", nats: map[string]any{"subject": prefix + "hang", "timeout": "1s"}, web: map[string]any{"url": hang, "timeout": "1s"}},
		{name: "garbage", nats: map[string]any{"subject": prefix + "garbage"}, web: map[string]any{"url": garbage}},
		{name: "absent", nats: map[string]any{"subject": prefix + "absent"}, web: map[string]any{"url": "http://127.0.0.1:1/absent"}},
	} {
		for _, transport := range []string{"nats", "webhook"} {
			hook := map[string]any{"webhook": tc.web}
			if transport == "nats" {
				hook = map[string]any{"nats": tc.nats}
			}
			name := "fail-" + tc.name + "-" + transport
			// A DecoratorController selects its parent by label, so each
			// failure has a parent of its own.
			createController(t, inst, decoratorKind, name+"-"+ns, map[string]any{
				"resources": []any{map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets",
					"labelSelector": map[string]any{"matchLabels": map[string]any{"e2e-fail": name}}}},
				"hooks": map[string]any{"sync": hook},
			})
			w := widgetLabels(name, map[string]string{"e2e-fail": name})
			if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, w, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tc := range []struct{ name, want, natsWant string }{
		{"hang", "hook call timed out", ""},
		{"garbage", "cannot decode response", ""},
		{"absent", "sync hook failed", "no hook is subscribed to NATS subject " + prefix + "absent"},
	} {
		for _, transport := range []string{"webhook", "nats"} {
			parent := "fail-" + tc.name + "-" + transport
			want := []string{tc.want}
			if transport == "nats" && tc.natsWant != "" {
				want = append(want, tc.natsWant)
			}
			eventually(t, 60*time.Second, "a SyncError on "+parent, func() error {
				return warningEvent(ctx, ns, parent, "SyncError", want...)
			})
		}
	}
	// Each Event names the failure the same way whatever the transport
	// (hookError); retried with backoff, as a webhook's failure is.
	eventually(t, 30*time.Second, "the garbage-answering NATS hook called again", func() error {
		if n := garbageCalls.Load(); n < 2 {
			return fmt.Errorf("called %d times", n)
		}
		return nil
	})
	// A subject on metabus's own bus is refused before anything is sent,
	// reported on the parent and the controller as a refused webhook is.
	spy, err := nc.SubscribeSync("mc.work.cc-x.forged")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	const refused = "fail-refused-nats"
	createController(t, inst, decoratorKind, refused+"-"+ns, map[string]any{
		"resources": []any{map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets",
			"labelSelector": map[string]any{"matchLabels": map[string]any{"e2e-fail": refused}}}},
		"hooks": map[string]any{"sync": map[string]any{"nats": map[string]any{"subject": "mc.work.cc-x.forged"}}},
	})
	if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, widgetLabels(refused, map[string]string{"e2e-fail": refused}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	refusedSync(t, ns, refused, refused+"-"+ns, "sync hook not called", "NATS hook subject mc.work.cc-x.forged is under mc.")
	if m, err := spy.NextMsg(100 * time.Millisecond); err == nil {
		t.Errorf("a request reached the bus subject %s", m.Subject)
	}
	for _, transport := range []string{"webhook", "nats"} {
		if got, _ := configMapNames(ctx, ns, "fail-garbage-"+transport); len(got) > 0 {
			t.Errorf("a garbage answer over %s created children %v", transport, got)
		}
	}
}
