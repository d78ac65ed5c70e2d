package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/internal/allinone"
	"github.com/metabus/metabus/sdk/hook"
)

// natsReplica is one hook process serving a controller's hooks over NATS
// through the SDK (hook.ServeNATS, one queue subscription per subject) on
// its own connection, with a count of the calls it answered.
type natsReplica struct {
	nc    *nats.Conn
	calls atomic.Int64
	// modes counts the calls by the CloudEvents mode they arrived in.
	modes [3]atomic.Int64
	// done receives each ServeNATS's return once its connection is closed
	// or the test ends.
	done chan error
}

// serveSDKHooks starts a replica serving each subject of hooks with its
// SDK handler in the queue group queue, and returns once the server knows
// every subscription. Closing the replica's connection is a crash: the
// calls it holds are never answered.
func serveSDKHooks(t *testing.T, url, queue string, hooks map[string]hook.Handler) *natsReplica {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &natsReplica{nc: nc, done: make(chan error, len(hooks))}
	t.Cleanup(func() {
		cancel()
		for range hooks {
			if err := <-r.done; err != nil {
				t.Errorf("ServeNATS: %v", err)
			}
		}
		nc.Close()
	})
	for subject, h := range hooks {
		counted := hook.HandlerFunc(func(ctx context.Context, call *hook.Call) ([]byte, error) {
			r.calls.Add(1)
			r.modes[call.Mode].Add(1)
			return h.ServeHook(ctx, call)
		})
		go func() { r.done <- hook.ServeNATS(ctx, nc, subject, queue, counted) }()
	}
	eventually(t, 10*time.Second, "the replica's subscriptions", func() error {
		if n := nc.NumSubscriptions(); n != len(hooks) {
			return fmt.Errorf("%d of %d subscribed", n, len(hooks))
		}
		return nc.Flush()
	})
	return r
}

// widgetSDKHook is widgetHook written against the SDK's types: one
// ConfigMap per spec.items entry, and a finalize call answered finalized
// (counted in finalized).
func widgetSDKHook(finalized *atomic.Int64) hook.Handler {
	return hook.Composite(func(_ context.Context, req *hook.CompositeRequest) (*hook.CompositeResponse, error) {
		if req.Finalizing {
			finalized.Add(1)
			return &hook.CompositeResponse{Finalized: true}, nil
		}
		items, _, _ := unstructured.NestedStringSlice(req.Parent.Object, "spec", "items")
		version, _, _ := unstructured.NestedFieldNoCopy(req.Parent.Object, "spec", "version")
		resp := &hook.CompositeResponse{Status: map[string]any{
			"configMaps": len(req.Children.Of("v1", "ConfigMap")), "version": version,
		}}
		for _, it := range items {
			cm := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
				"data": map[string]any{"item": it, "version": fmt.Sprint(version)}}}
			cm.SetName(req.Parent.GetName() + "-" + it)
			cm.SetLabels(map[string]string{"app": req.Parent.GetName()})
			resp.Children = append(resp.Children, cm)
		}
		return resp, nil
	})
}

// TestNATSHooksQueueGroup: a CompositeController whose sync, finalize and
// customize hooks are served over NATS by the SDK in two replicas of one
// queue group. One replica's connection is closed while parents are being
// synced (a crash: what it held is never answered): nothing is lost,
// every parent converges on the other one, and deleting the parents runs
// the finalize hook, which releases them.
func TestNATSHooksQueueGroup(t *testing.T) {
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	prefix := "hooks.e2e." + ns + "."
	var finalized, customized atomic.Int64
	widgets := widgetSDKHook(&finalized)
	hooks := map[string]hook.Handler{
		prefix + "sync":     widgets,
		prefix + "finalize": widgets,
		prefix + "customize": hook.Customize(func(context.Context, *hook.CustomizeRequest) (*hook.CustomizeResponse, error) {
			customized.Add(1)
			return &hook.CustomizeResponse{RelatedResources: []hook.RelatedResourceRule{}}, nil
		}),
	}
	a := serveSDKHooks(t, inst.url, "widgets", hooks)
	b := serveSDKHooks(t, inst.url, "widgets", hooks)
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
	if customized.Load() == 0 {
		t.Error("the customize hook was never called over NATS")
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
	if finalized.Load() < parents {
		t.Errorf("the finalize hook answered %d calls over NATS, want at least one per parent (%d)", finalized.Load(), parents)
	}
	// The dispatcher sends binary-mode CloudEvents unless told otherwise.
	for name, r := range map[string]*natsReplica{"a": a, "b": b} {
		if n := r.modes[hook.ModePlain].Load() + r.modes[hook.ModeStructured].Load(); n > 0 {
			t.Errorf("replica %s got %d calls that were not binary-mode CloudEvents", name, n)
		}
	}
	t.Logf("calls answered: replica a %d (closed mid-run), replica b %d; %d finalize, %d customize",
		a.calls.Load(), b.calls.Load(), finalized.Load(), customized.Load())
}

// TestNATSHookStructuredThrottled: a NATS hook with cloudEvents:
// structured, served by the SDK, gets structured-mode CloudEvents; when it
// answers hook.Throttled(2s) (code 429 with Retry-After) the dispatcher
// calls again no sooner than that, without a SyncError Event, as it does
// for a webhook's 429 (TestHook429RetryAfter). The dispatcher has a
// connection of its own for hooks (allinone.Config.HookConnection), which
// carries the requests.
func TestNATSHookStructuredThrottled(t *testing.T) {
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{HookConnection: true}, nil)
	ns := newNamespace(t)
	subject := "hooks.e2e." + ns + ".sync"
	const retryAfter = 2 * time.Second
	var busyCalls, first, second atomic.Int64
	var finalized atomic.Int64
	widgets := widgetSDKHook(&finalized)
	throttleOnce := hook.HandlerFunc(func(ctx context.Context, call *hook.Call) ([]byte, error) {
		// Only the test's own parent counts (the event's subject is its path).
		if strings.HasSuffix(call.Subject, "/busy") {
			switch now := time.Now().UnixNano(); busyCalls.Add(1) {
			case 1:
				first.Store(now)
				return nil, hook.Throttled(retryAfter, "the test's hook is busy")
			case 2:
				second.Store(now)
			}
		}
		return widgets.ServeHook(ctx, call)
	})
	r := serveSDKHooks(t, inst.url, "widgets", map[string]hook.Handler{subject: throttleOnce})
	createController(t, inst, compositeKind, "widgets-structured-"+ns, map[string]any{
		"parentResource": map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets"},
		"childResources": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": map[string]any{"method": "InPlace"}}},
		"hooks":          map[string]any{"sync": map[string]any{"nats": map[string]any{"subject": subject, "cloudEvents": "structured"}}},
	})
	if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, newWidget("busy", []string{"a"}, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the child after the throttled call", func() error {
		_, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, "busy-a", metav1.GetOptions{})
		return err
	})
	if n := r.modes[hook.ModeStructured].Load(); n == 0 || n != r.calls.Load() {
		t.Errorf("%d of %d calls were structured-mode CloudEvents, want all", n, r.calls.Load())
	}
	gap := time.Duration(second.Load() - first.Load())
	t.Logf("hook.Throttled(%s) over NATS → called again after %s", retryAfter, gap.Round(time.Millisecond))
	if gap < retryAfter {
		t.Errorf("called again after %s, before the %s the hook asked for", gap, retryAfter)
	}
	noSyncError(ctx, t, ns, "a throttled answer")
	connz, err := inst.nats.Connz(&server.ConnzOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sent := map[string]int64{}
	for _, c := range connz.Conns {
		sent[c.Name] += c.InMsgs // what the server received from it
	}
	if n := sent["metabus-dispatcher-0-hooks"]; n < r.calls.Load() {
		t.Errorf("the dispatcher's hook connection sent %d messages for %d hook calls (connections: %v)", n, r.calls.Load(), sent)
	}
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
