package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/metabus/metabus/examples/helloworld"
	"github.com/metabus/metabus/internal/allinone"
	"github.com/metabus/metabus/internal/testing/testnats"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/discovery"
	"github.com/metabus/metabus/pkg/hooks"
	"github.com/metabus/metabus/pkg/jsbus"
	"github.com/metabus/metabus/pkg/kubeapi"
	"github.com/metabus/metabus/pkg/natsx"
	"github.com/metabus/metabus/pkg/opscli"
	"github.com/metabus/metabus/pkg/render"
	"github.com/metabus/metabus/sdk/hook"
	"github.com/metabus/metabus/services/applier"
	"github.com/metabus/metabus/services/dispatcher"
	"github.com/metabus/metabus/services/revisions"
	"github.com/metabus/metabus/services/watcher"
)

// opsPartitions keeps the test's partition consumers few: every one costs
// the machine a consumer and a lease renewal per stage.
const opsPartitions = 8

// opsAckWait is the work consumers' AckWait: short, so that a message a
// crashing replica never settles reaches MaxDeliver, and MC_DLQ, in about
// 15 AckWaits (the partition backoff: 1, 2, 4, 8).
const opsAckWait = 300 * time.Millisecond

// opsStack is metabus as deployed: each stage in this process but on its
// own NATS connection as its own nkey user of the shipped
// nats-server.conf, and under its own ServiceAccount's RBAC.
type opsStack struct {
	nats  *testnats.Production
	label string
	ctx   context.Context
	wg    sync.WaitGroup
}

// connectAs connects to the stack's NATS as one of its users (a service or
// an operator), recording every permission violation the server reports.
func (s *opsStack) connectAs(t *testing.T, user string, denied *[]string, mu *sync.Mutex) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(s.nats.URL, nkeyOption(t, s.nats.Seeds[user]), nats.CustomInboxPrefix(opscli.InboxPrefix), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if denied != nil && strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
			mu.Lock()
			*denied = append(*denied, user+": "+err.Error())
			mu.Unlock()
		}
	}))
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

func nkeyOption(t *testing.T, seed string) nats.Option {
	t.Helper()
	o, err := nats.NkeyOptionFromSeed(seed)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// run starts a stage until the test ends.
func (s *opsStack) run(t *testing.T, name string, f func(context.Context) error) context.CancelFunc {
	ctx, cancel := context.WithCancel(s.ctx)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := f(ctx); err != nil && ctx.Err() == nil {
			t.Errorf("%s stopped: %v", name, err)
		}
	}()
	return cancel
}

// serviceConn is a stage's NATS connection, as its binary makes it.
func (s *opsStack) serviceConn(t *testing.T, svc string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, js, err := natsx.Connect(natsx.ConnOptions{URL: s.nats.URL, Name: "metabus-" + svc, NKeySeed: s.nats.Seeds[svc],
		InboxPrefix: natsx.ServiceInboxPrefix(svc), Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc, js
}

// operator is the CLI's view as one of the operator users.
func (s *opsStack) operator(t *testing.T, user string) *opscli.Bus {
	t.Helper()
	nc, js := s.connectAs(t, user, nil, nil)
	rc := rest.CopyConfig(env.Config)
	api, err := kubeapi.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return &opscli.Bus{
		NC: nc, JS: js, Dyn: dynamic.NewForConfigOrDie(rc),
		Disc: discovery.New(discovery.APIServer{API: api}), Timeout: 2 * time.Second,
	}
}

// TestOps runs the operator CLI (status, dlq list|show|replay|purge, tail,
// explain, render) against metabus deployed as its separate stages on a
// nats-server loaded from the shipped configuration, as the read-only
// operator user and as operator-admin, and a real API server. A poison
// work item reaches MC_DLQ the real way: a replica that takes it and
// never settles it until its deliveries run out.
func TestOps(t *testing.T) {
	if testing.Short() {
		t.Skip("runs metabus on the production NATS configuration")
	}
	// Most of its time is a poison item's deliveries running out, one
	// AckWait after another.
	waitsInParallel(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	s := &opsStack{nats: testnats.StartProduction(t, "../deploy/nats/nats-server.conf"), label: "ops", ctx: ctx}
	defer s.wg.Wait()
	defer cancel()
	sa := asServiceAccounts(rest.CopyConfig(env.Config))
	log := zaptest.NewLogger(t)

	// --- watcher, revisions and applier; the dispatcher comes later.
	var wcfg watcher.Config
	fs := flag.NewFlagSet("watcher", flag.ContinueOnError)
	wcfg.RegisterFlags(fs)
	if err := fs.Parse([]string{"--target-label-selector=metabus.dev/e2e=" + s.label, fmt.Sprintf("--partitions=%d", opsPartitions)}); err != nil {
		t.Fatal(err)
	}
	wcfg.DiscoveryInterval = 5 * time.Second
	wcfg.Bus.WorkAckWait = opsAckWait
	nc, js := s.serviceConn(t, "watcher")
	w, err := watcher.New(wcfg, watcher.Deps{REST: sa[allinone.ServiceWatcher], NC: nc, JS: js, Log: log.Named("watcher")})
	if err != nil {
		t.Fatal(err)
	}
	s.run(t, "watcher", w.Run)
	var rcfg revisions.Config
	rcfg.RegisterFlags(flag.NewFlagSet("revisions", flag.ContinueOnError))
	nc, _ = s.serviceConn(t, "revisions")
	rv, err := revisions.New(rcfg, revisions.Deps{REST: sa[allinone.ServiceRevisions], NC: nc, Log: log.Named("revisions")})
	if err != nil {
		t.Fatal(err)
	}
	s.run(t, "revisions", rv.Run)
	nc, js = s.serviceConn(t, "applier")
	ap, err := applier.New(applier.Config{DiscoveryInterval: 5 * time.Second}, applier.Deps{REST: sa[allinone.ServiceApplier], NC: nc, JS: js, Log: log.Named("applier")})
	if err != nil {
		t.Fatal(err)
	}
	s.run(t, "applier", ap.Run)

	// --- the controller: HelloWorld, whose hook fails for a parent named
	// "broken".
	ns := newNamespace(t)
	hook := hookServer(t, opsHook(""))
	hookV2 := hookServer(t, opsHook("Hi"))
	cc := manifest(t, "controller.yaml")
	_ = unstructured.SetNestedField(cc, hook+"/sync", "spec", "hooks", "sync", "webhook", "url")
	ctrl := createController(t, &instance{selector: s.label}, "CompositeController", "hello-ops", cc["spec"].(map[string]any))
	ctrlID := bus.ControllerID("CompositeController", "hello-ops")

	// --- a poison work item: a replica (here the test, as the dispatcher
	// user) takes the item of "poison" and never settles it; the real DLQ
	// worker parks it after MaxDeliver.
	nc, djs := s.serviceConn(t, "dispatcher")
	if err := jsbus.WaitReady(ctx, djs); err != nil {
		t.Fatal(err)
	}
	dead := make(chan jsbus.DeadLetter, 4)
	stopDLQ := s.run(t, "dead-letter worker", func(ctx context.Context) error {
		return jsbus.RunDLQ(ctx, djs, func(dl jsbus.DeadLetter) { dead <- dl }, func(err error) { t.Logf("dlq: %v", err) })
	})
	poison := createHello(t, ns, "poison", "Poison")
	cons, err := djs.Consumer(ctx, bus.WorkStream, bus.PartitionConsumerName(bus.WorkConsumerPrefix, opsPartitions,
		bus.PartitionOf(bus.Slot(ctrlID, string(poison.GetUID())), opsPartitions)))
	if err != nil {
		t.Fatal(err)
	}
	// Only poison's first item is held: the watcher may queue a second
	// one for poison (its Pod informer's first sync can come after
	// poison's creation), and held too it would be parked as well, making
	// the DLQ entries of one parent one or two by timing. The partition
	// also takes items of other tests' HelloWorlds (this controller
	// selects parents in every namespace, and the dispatcher is not
	// running yet). The test's replica terminates any other item, so
	// exactly one entry is parked, poison's.
	var held uint64
	deadline := time.After(60 * time.Second)
	for parked := false; !parked; {
		select {
		case dl := <-dead:
			if dl.Parent.Name != "poison" {
				t.Fatalf("dead letter for %v, want poison", dl.Parent)
			}
			parked = true
		case <-deadline:
			t.Fatal("the poison item did not reach MC_DLQ")
		default:
			batch, err := cons.Fetch(1, jetstream.FetchMaxWait(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			for m := range batch.Messages() {
				seq, _, err := jsbus.Meta(m)
				if err != nil {
					t.Fatal(err)
				}
				var item bus.WorkItem
				if err := jsbus.Decode(m, bus.TypeSyncRequested, &item); err != nil {
					t.Fatalf("work item %d: %v", seq, err)
				}
				if held == 0 && item.Parent.UID == string(poison.GetUID()) {
					held = seq
				}
				if seq != held {
					_ = m.TermWithReason("e2e: only one poison item is held")
				} // the held one: taken, never settled
			}
		}
	}
	stopDLQ()

	// --- the dispatcher, and two more parents: one converges, one fails.
	var dcfg dispatcher.Config
	dfs := flag.NewFlagSet("dispatcher", flag.ContinueOnError)
	dcfg.RegisterFlags(dfs)
	dcfg.Bus.WorkAckWait = opsAckWait
	nc, djs = s.serviceConn(t, "dispatcher")
	d, err := dispatcher.New(dcfg, dispatcher.Deps{REST: sa[allinone.ServiceDispatcher], NC: nc, JS: djs, Log: log.Named("dispatcher")})
	if err != nil {
		t.Fatal(err)
	}
	s.run(t, "dispatcher", d.Run)
	createHello(t, ns, "good", "Good")
	createHello(t, ns, "broken", "Broken")
	waitHelloPod(t, ns, "good", "echo Hello, Good!")

	op := s.operator(t, "operator")
	admin := s.operator(t, "operator-admin")

	t.Run("status", func(t *testing.T) {
		var st *opscli.Status
		eventually(t, 30*time.Second, "status shows the stages, the activity and the broken parent's error", func() error {
			var err error
			if st, err = op.GetStatus(ctx, opscli.StatusOptions{Controller: "cc/hello-ops"}); err != nil {
				return err
			}
			stages := map[string]opscli.StageStatus{}
			for _, s := range st.Stages {
				stages[s.Stage] = s
			}
			for _, name := range []string{"watcher", "dispatcher", "applier", "revisions"} {
				if stages[name].Replicas != 1 {
					return fmt.Errorf("%s: %d replicas, want 1", name, stages[name].Replicas)
				}
			}
			for _, name := range []string{"dispatcher", "applier"} {
				s := stages[name]
				if s.Partitions != opsPartitions || s.Unowned != 0 || len(s.Members) != 1 || s.Members[0].Partitions != opsPartitions || !s.Members[0].Answered {
					return fmt.Errorf("%s: %+v", name, s)
				}
			}
			if len(st.Controllers) != 1 {
				return fmt.Errorf("controllers %+v", st.Controllers)
			}
			c := st.Controllers[0]
			if c.ID != ctrlID || c.DLQ != 1 || c.HookCalls < 2 || c.HookErrors < 1 || c.Applies < 1 || c.Scheduled < 1 {
				return fmt.Errorf("controller %+v", c)
			}
			if c.LastError == nil || c.LastError.Parent != ns+"/broken" || !strings.Contains(c.LastError.Message, "500") {
				return fmt.Errorf("last error %+v", c.LastError)
			}
			// The server the tests run (go.mod's) resets consumers.
			if st.NATS == nil || !st.NATS.ConsumerReset || st.NATS.Version != natsx.BuiltServerVersion {
				return fmt.Errorf("NATS server %+v, want %s able to reset consumers", st.NATS, natsx.BuiltServerVersion)
			}
			return nil
		})
		var out bytes.Buffer
		if err := opscli.WriteStatus(&out, st); err != nil {
			t.Fatal(err)
		}
		t.Logf("metabus status:\n%s", out.String())
		for _, want := range []string{"dispatcher", "compositecontroller/hello-ops", ns + "/broken", "consumer reset supported"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("status table lacks %q", want)
			}
		}
	})

	var poisonSeq uint64
	t.Run("dlq list and show", func(t *testing.T) {
		entries, err := op.DLQList(ctx, opscli.DLQFilter{Controller: "cc/hello-ops", Parent: ns + "/poison"}, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 1 || entries[0].Stage != bus.WorkStage || entries[0].Deliveries != bus.MaxDeliver || entries[0].Parent.UID != string(poison.GetUID()) {
			t.Fatalf("entries %+v", entries)
		}
		poisonSeq = entries[0].Seq
		var list bytes.Buffer
		_ = opscli.WriteDLQ(&list, time.Now(), entries)
		t.Logf("metabus dlq list:\n%s", list.String())
		if others, err := op.DLQList(ctx, opscli.DLQFilter{Parent: ns + "/good"}, 0); err != nil || len(others) != 0 {
			t.Errorf("good's entries %v, %v", others, err)
		}
		shown, err := op.DLQList(ctx, opscli.DLQFilter{Seqs: []uint64{poisonSeq}}, 0)
		if err != nil || len(shown) != 1 {
			t.Fatalf("show %d: %v %v", poisonSeq, shown, err)
		}
		var out bytes.Buffer
		_ = opscli.WriteDLQEntry(&out, time.Now(), shown[0])
		t.Logf("metabus dlq show %d:\n%s", poisonSeq, out.String())
		if !strings.Contains(out.String(), "max deliveries exceeded") || !strings.Contains(out.String(), `"name": "poison"`) {
			t.Errorf("show lacks the reason or the body")
		}
		if _, err := op.DLQList(ctx, opscli.DLQFilter{Seqs: []uint64{poisonSeq + 1000}}, 0); opscli.Code(err) != opscli.ExitNotFound {
			t.Errorf("show of a missing entry: %v (exit %d), want exit %d", err, opscli.Code(err), opscli.ExitNotFound)
		}
	})

	t.Run("explain", func(t *testing.T) {
		ex, err := op.Explain(ctx, opscli.ExplainOptions{Object: ns + "/good"})
		if err != nil {
			t.Fatal(err)
		}
		if ex.Controller != "compositecontroller/hello-ops" || len(ex.Syncs) == 0 || len(ex.Applies) == 0 {
			t.Fatalf("explanation %+v", ex)
		}
		// The last hook call: syncs after it may have been merged into it
		// (their snapshots showed exactly what it was shown).
		sync := ex.Syncs[0]
		for _, s := range ex.Syncs {
			if sync = s; s.Result != "merged" {
				break
			}
		}
		// "unchanged": the hook answered what the cluster already is, so
		// the dispatcher settled the answer without a desired state.
		if (sync.Result != "ok" && sync.Result != "unchanged") || len(sync.Hooks) == 0 || sync.Hooks[0].Hook != bus.HookSync || sync.Answer == nil ||
			len(sync.Answer.Children) != 1 || sync.Answer.Children[0].Kind != "Pod" {
			t.Errorf("last sync %+v", sync)
		}
		// The last apply's writes, each named (the Pod's create, or the
		// parent's status when that came last), or none when the last
		// apply found nothing to do (the sync its own writes caused).
		if last := ex.Applies[0]; !(last.Result == "ok" && len(ex.Writes) > 0) && !(last.Result == "noop" && len(ex.Writes) == 0) {
			t.Errorf("last apply %s with writes %+v", last.Result, ex.Writes)
		}
		for _, w := range ex.Writes {
			if w.Object != "Pod "+ns+"/good" && w.Object != "parent "+ns+"/good" {
				t.Errorf("write %+v: not named as good's Pod or good", w)
			}
		}
		var out bytes.Buffer
		_ = opscli.WriteExplanation(&out, ex)
		t.Logf("metabus explain %s/good:\n%s", ns, out.String())

		eventually(t, 30*time.Second, "explain shows broken's failed hook call, its pending retry and its SyncError Event", func() error {
			ex, err := op.Explain(ctx, opscli.ExplainOptions{Object: ns + "/broken", Controller: "hello-ops"})
			if err != nil {
				return err
			}
			if len(ex.Syncs) == 0 || ex.Syncs[0].Result != "error" || !strings.Contains(ex.Syncs[0].Error, "500") {
				return fmt.Errorf("broken's syncs %+v", ex.Syncs)
			}
			if len(ex.Pending.Schedule) == 0 || ex.Pending.Schedule[0].Reason != bus.ReasonRetry {
				return fmt.Errorf("broken's pending retry %+v", ex.Pending)
			}
			for _, e := range ex.Events {
				if e.Reason == "SyncError" && strings.Contains(e.Message, "500") {
					return nil
				}
			}
			return fmt.Errorf("events %+v lack the SyncError", ex.Events)
		})
		ex, err = op.Explain(ctx, opscli.ExplainOptions{Object: ns + "/poison"})
		if err != nil {
			t.Fatal(err)
		}
		if len(ex.Pending.DLQ) != 1 || ex.Pending.DLQ[0].Seq != poisonSeq {
			t.Errorf("poison's DLQ entries %+v", ex.Pending.DLQ)
		}
		if _, err := op.Explain(ctx, opscli.ExplainOptions{Object: ns + "/nobody"}); opscli.Code(err) != opscli.ExitNotFound {
			t.Errorf("explain of a missing parent: %v", err)
		}
	})

	t.Run("render", func(t *testing.T) {
		live, err := dyn.Resource(helloGVR).Namespace(ns).Get(ctx, "good", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		liveCtrl, err := dyn.Resource(controllerGVRs["CompositeController"]).Get(ctx, ctrl.GetName(), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		hc := hooks.New(hooks.Options{})
		// Offline: files only, no children: the Pod is to be created.
		parentFile := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "example.com/v1", "kind": "HelloWorld",
			"metadata": map[string]any{"name": "fresh", "namespace": ns}, "spec": map[string]any{"who": "Fresh"},
		}}
		res, err := render.Render(ctx, render.Input{Controller: liveCtrl, Parent: parentFile, Resolve: render.Offline(parentFile), Hooks: hc})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Changes.Children) != 1 || res.Changes.Children[0].Action != render.Create || res.Changes.Children[0].Name != "fresh" {
			t.Errorf("offline render: %+v", res.Changes)
		}
		// From the cluster: the converged parent, its own hook: nothing to do.
		fromCluster := render.Input{Controller: liveCtrl, Parent: live, Resolve: op.Resolver(ctx), List: op.ClusterLister(), Hooks: hc}
		res, err = render.Render(ctx, fromCluster)
		if err != nil {
			t.Fatal(err)
		}
		if res.Changed() {
			t.Errorf("the converged parent would change: %+v", res.Changes)
		}
		// A new hook version: the Pod's command changes.
		fromCluster.HookURL = hookV2 + "/sync"
		res, err = render.Render(ctx, fromCluster)
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		_ = opscli.WriteRender(&out, res)
		t.Logf("metabus render --from-cluster --hook-url v2:\n%s", out.String())
		if !res.Changed() || !strings.Contains(out.String(), "recreate Pod "+ns+"/good") || !strings.Contains(out.String(), "Hi, ") {
			t.Errorf("render with v2 does not show the Pod's update")
		}
		// The shadow run over every parent of the controller.
		sh, err := op.RenderAll(ctx, "cc/hello-ops", render.Input{HookURL: hookV2 + "/sync", Hooks: hc})
		if err != nil {
			t.Fatal(err)
		}
		out.Reset()
		_ = opscli.WriteShadow(&out, sh)
		t.Logf("metabus render --controller cc/hello-ops --all --hook-url v2:\n%s", out.String())
		rows := map[string]opscli.ShadowRow{}
		for _, r := range sh.Parents {
			rows[strings.TrimPrefix(r.Parent, ns+"/")] = r
		}
		if !rows["good"].Changed || rows["good"].Update != 1 || rows["broken"].Error != "" || !rows["broken"].Changed || rows["broken"].Create != 1 {
			t.Errorf("shadow rows %+v", sh.Parents)
		}
	})

	t.Run("tail", func(t *testing.T) {
		for _, format := range []opscli.Format{opscli.Table, opscli.JSON} {
			out := &lockedBuffer{}
			tctx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				done <- op.Tail(tctx, opscli.TailOptions{Controller: "cc/hello-ops", Parent: ns + "/good", Format: format}, out)
			}()
			time.Sleep(500 * time.Millisecond) // subscribed and announced
			patchWho(t, ns, "good", "Good "+string(format))
			want := []string{"WORK", "SYNC", "DESIRED", "APPLY"}
			if format == opscli.JSON {
				want = []string{`"type":"` + bus.TypeSyncRequested, `"type":"` + bus.TypeDesired, `"stage":"work"`, `"stage":"desired"`}
			}
			eventually(t, 30*time.Second, "tail -o "+string(format)+" shows the update's work item, sync, desired state and apply", func() error {
				for _, w := range want {
					if !strings.Contains(out.String(), w) {
						return fmt.Errorf("no %s in\n%s", w, out.String())
					}
				}
				return nil
			})
			stop()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if strings.Contains(out.String(), "broken") || strings.Contains(out.String(), "poison") {
				t.Errorf("tail --parent %s/good printed other parents:\n%s", ns, out.String())
			}
			t.Logf("metabus tail -o %s:\n%s", format, out.String())
		}
	})

	t.Run("the metabus binary", func(t *testing.T) {
		bin := filepath.Join(serviceBinaries(t), "metabus")
		conn := []string{"--kubeconfig", env.Kubeconfig, "--nats-url", s.nats.URL, "--nats-nkey", s.nats.Seeds["operator"]}
		run := func(args ...string) (string, int) {
			cmd := exec.CommandContext(ctx, bin, append(args, conn...)...)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				return string(out), exit.ExitCode()
			}
			if err != nil {
				t.Fatal(err)
			}
			return string(out), 0
		}
		out, code := run("status", "--controller", "cc/hello-ops", "-o", "json")
		var st opscli.Status
		if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil || len(st.Controllers) != 1 || st.Controllers[0].DLQ != 1 {
			t.Errorf("metabus status -o json: exit %d, %v\n%s", code, err, out)
		}
		out, code = run("dlq", "list", "--parent", ns+"/poison")
		if code != 0 || !strings.Contains(out, "max deliveries exceeded") {
			t.Errorf("metabus dlq list: exit %d\n%s", code, out)
		}
		if out, code = run("explain", ns+"/nobody"); code != opscli.ExitNotFound {
			t.Errorf("metabus explain of a missing parent: exit %d, want %d\n%s", code, opscli.ExitNotFound, out)
		}
		if out, code = run("explain", ns+"/good", "-o", "yaml"); code != 0 || !strings.Contains(out, "controller: compositecontroller/hello-ops") {
			t.Errorf("metabus explain -o yaml: exit %d\n%s", code, out)
		}
		out, code = run("render", "--controller", "cc/hello-ops", "--all", "--hook-url", hookV2+"/sync")
		if code != opscli.ExitDiffers || !strings.Contains(out, "would change") {
			t.Errorf("metabus render --all with v2: exit %d, want %d\n%s", code, opscli.ExitDiffers, out)
		}
		// The read-only user is refused a replay: the publish times out.
		out, code = run("dlq", "replay", fmt.Sprint(poisonSeq))
		if code != opscli.ExitError || !strings.Contains(out, "failed") {
			t.Errorf("metabus dlq replay as operator: exit %d, want %d\n%s", code, opscli.ExitError, out)
		}
		// tail until its first line for good.
		tctx, stop := context.WithTimeout(ctx, 30*time.Second)
		defer stop()
		tail := exec.CommandContext(tctx, bin, append([]string{"tail", "--parent", ns + "/good"}, conn...)...)
		lines := &lockedBuffer{}
		tail.Stdout, tail.Stderr = lines, lines
		if err := tail.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		patchWho(t, ns, "good", "Good binary")
		eventually(t, 20*time.Second, "metabus tail prints the update", func() error {
			if !strings.Contains(lines.String(), "SYNC") || !strings.Contains(lines.String(), "APPLY") {
				return fmt.Errorf("tail printed %q", lines.String())
			}
			return nil
		})
		_ = tail.Process.Signal(syscall.SIGTERM)
		if err := tail.Wait(); err != nil {
			t.Errorf("metabus tail did not end cleanly on SIGTERM: %v", err)
		}
	})

	t.Run("dlq replay and purge", func(t *testing.T) {
		entries, err := op.DLQList(ctx, opscli.DLQFilter{Seqs: []uint64{poisonSeq}}, 0)
		if err != nil {
			t.Fatal(err)
		}
		// The read-only user may not change the DLQ: the server refuses,
		// which the client sees as a request that times out.
		denied, cancelDenied := context.WithTimeout(ctx, 3*time.Second)
		defer cancelDenied()
		if _, err := op.DLQPurge(denied, opscli.DLQFilter{Seqs: []uint64{poisonSeq}}, false); err == nil {
			t.Error("the read-only operator user purged a DLQ entry")
		}
		denied, cancelDenied = context.WithTimeout(ctx, 3*time.Second)
		defer cancelDenied()
		if rs, err := op.DLQReplay(denied, entries, false); err == nil && (len(rs) != 1 || rs[0].Result != "failed" || rs[0].Removed) {
			t.Errorf("the read-only operator user's replay: %+v", rs)
		}
		rs, err := admin.DLQReplay(ctx, entries, false)
		if err != nil {
			t.Fatal(err)
		}
		if len(rs) != 1 || rs[0].Result != "replayed" || !rs[0].Removed {
			t.Fatalf("replay %+v", rs)
		}
		var out bytes.Buffer
		_ = opscli.WriteReplay(&out, rs)
		t.Logf("metabus dlq replay %d:\n%s", poisonSeq, out.String())
		waitHelloPod(t, ns, "poison", "echo Hello, Poison!")
		left, err := op.DLQList(ctx, opscli.DLQFilter{}, 0)
		if err != nil || len(left) != 0 {
			t.Errorf("after replay: %v %v", left, err)
		}
		if _, err := admin.DLQPurge(ctx, opscli.DLQFilter{}, false); opscli.Code(err) != opscli.ExitUsage {
			t.Errorf("purge without a selection: %v, want a usage error", err)
		}
		n, err := admin.DLQPurge(ctx, opscli.DLQFilter{}, true)
		if err != nil || n != 0 {
			t.Errorf("purge --all: %d, %v", n, err)
		}
	})
}

// opsHook is the HelloWorld hook, greeting with greeting ("" keeps
// "Hello"), failing with 500 for a parent named "broken". It answers plain
// JSON, as a legacy hook does (the SDK's handler, which TestHelloWorld
// runs, answers metabus with a CloudEvent).
func opsHook(greeting string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req hook.CompositeRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if req.Parent.GetName() == "broken" && greeting == "" {
			http.Error(w, "the hook is broken for this parent", http.StatusInternalServerError)
			return
		}
		resp, err := helloworld.Sync(r.Context(), &req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if greeting != "" {
			who, _, _ := unstructured.NestedString(req.Parent.Object, "spec", "who")
			containers, _, _ := unstructured.NestedSlice(resp.Children[0].Object, "spec", "containers")
			containers[0].(map[string]any)["command"] = []any{"echo", greeting + ", " + who + "!"}
			_ = unstructured.SetNestedSlice(resp.Children[0].Object, containers, "spec", "containers")
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(resp)
	})
}

func createHello(t *testing.T, ns, name, who string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "example.com/v1", "kind": "HelloWorld",
		"metadata": map[string]any{"name": name, "namespace": ns}, "spec": map[string]any{"who": who},
	}}
	out, err := dyn.Resource(helloGVR).Namespace(ns).Create(context.Background(), u, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func patchWho(t *testing.T, ns, name, who string) {
	t.Helper()
	patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"who": who}})
	if _, err := dyn.Resource(helloGVR).Namespace(ns).Patch(context.Background(), name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

func waitHelloPod(t *testing.T, ns, name, command string) {
	t.Helper()
	eventually(t, 60*time.Second, "Pod "+name, func() error {
		pod, err := dyn.Resource(podsGVR).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got := podCommand(pod); got != command {
			return fmt.Errorf("command %q, want %q", got, command)
		}
		return nil
	})
}

// lockedBuffer is a bytes.Buffer written by one goroutine and read by
// another.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestRenderCustomizeAndMapController runs `metabus render` (package
// render, and RenderAll: --controller NAME --all) from a real API server
// for the two kinds of sync a plain CompositeController render does not
// show: a controller with a customize hook, whose sync hook must be shown
// the related objects the customize answer selects in the cluster, and a
// MapController, whose parent is one map hook call per input it selects.
// Render needs no bus, so no metabus runs: the controllers carry a label
// no instance serves.
func TestRenderCustomizeAndMapController(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ensureMapCRDs(t)
	ns := newNamespace(t)
	rc := rest.CopyConfig(env.Config)
	api, err := kubeapi.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	op := &opscli.Bus{Dyn: dyn, Disc: discovery.New(discovery.APIServer{API: api}), Timeout: 2 * time.Second}
	nobody := &instance{selector: "render-only"}
	hc := hooks.New(hooks.Options{})
	type call struct {
		path string
		body map[string]any
	}
	var mu sync.Mutex
	var calls []call
	recorded := func() []call {
		mu.Lock()
		defer mu.Unlock()
		out := calls
		calls = nil
		return out
	}
	hook := hookServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		mu.Lock()
		calls = append(calls, call{path: r.URL.Path, body: body})
		mu.Unlock()
		var answer any
		switch r.URL.Path {
		case "/customize":
			answer = map[string]any{"relatedResources": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps",
				"labelSelector": map[string]any{"matchLabels": map[string]any{"render-e2e": "related"}}}}}
		case "/sync":
			// One ConfigMap saying how many related ConfigMaps it was shown.
			related, _ := body["related"].(map[string]any)["ConfigMap.v1"].(map[string]any)
			name := body["parent"].(map[string]any)["metadata"].(map[string]any)["name"].(string)
			answer = map[string]any{"children": []any{map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
				"metadata": map[string]any{"name": name + "-cm"}, "data": map[string]any{"related": fmt.Sprint(len(related))}}}}
		case "/map":
			input := body["input"].(map[string]any)["metadata"].(map[string]any)["name"].(string)
			answer = map[string]any{"outputs": []any{map[string]any{"apiVersion": mapGroup + "/v1", "kind": "DiskSnapshot",
				"metadata": map[string]any{"name": input + "-snap"}, "spec": map[string]any{"size": "new"}}}}
		default:
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(answer)
	}))
	create := func(gvr schema.GroupVersionResource, o map[string]any) *unstructured.Unstructured {
		t.Helper()
		out, err := dyn.Resource(gvr).Namespace(ns).Create(ctx, &unstructured.Unstructured{Object: o}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	cmGVR := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	asJSON := func(v any) map[string]any {
		data, _ := json.Marshal(v)
		var out map[string]any
		_ = json.Unmarshal(data, &out)
		return out
	}

	t.Run("customize hook", func(t *testing.T) {
		spec := map[string]any{
			"generateSelector": true,
			"parentResource":   map[string]any{"apiVersion": "example.com/v1", "resource": "helloworlds"},
			"childResources":   []any{map[string]any{"apiVersion": "v1", "resource": "configmaps"}},
			"hooks": map[string]any{
				"customize": map[string]any{"webhook": map[string]any{"url": hook + "/customize"}},
				"sync":      map[string]any{"webhook": map[string]any{"url": hook + "/sync"}},
			},
		}
		name := "render-customize-" + ns
		ctrl := createController(t, nobody, compositeKind, name, spec)
		parent := create(helloGVR, map[string]any{"apiVersion": "example.com/v1", "kind": "HelloWorld",
			"metadata": map[string]any{"name": "p"}, "spec": map[string]any{"who": "render"}})
		rel := create(cmGVR, map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": "related", "labels": map[string]any{"render-e2e": "related"}}})
		create(cmGVR, map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": "unrelated", "labels": map[string]any{"render-e2e": "other"}}})
		recorded()
		res, err := render.Render(ctx, render.Input{Controller: ctrl, Parent: parent, List: op.ClusterLister(), Resolve: op.Resolver(ctx), Hooks: hc})
		if err != nil {
			t.Fatal(err)
		}
		got := recorded()
		if len(got) != 2 || got[0].path != "/customize" || got[1].path != "/sync" {
			t.Fatalf("calls %+v, want customize then sync", got)
		}
		if diff := cmp.Diff(asJSON(map[string]any{"controller": ctrl.Object, "parent": parent.Object}), got[0].body); diff != "" {
			t.Errorf("customize request (-want +got):\n%s", diff)
		}
		wantRelated := asJSON(map[string]any{"ConfigMap.v1": map[string]any{"related": rel.Object}})
		if diff := cmp.Diff(wantRelated, got[1].body["related"]); diff != "" {
			t.Errorf("related objects sent to the sync hook (-want +got):\n%s", diff)
		}
		if len(res.Requests) != 2 || res.Requests[0].Hook != bus.HookCustomize {
			t.Errorf("result requests %+v", res.Requests)
		}
		if len(res.Changes.Children) != 1 || res.Changes.Children[0].Action != render.Create || res.Desired.Children[0].Object["data"].(map[string]any)["related"] != "1" {
			t.Errorf("render %+v", res.Changes)
		}
		var out bytes.Buffer
		_ = opscli.WriteRender(&out, res)
		t.Logf("metabus render --from-cluster:\n%s", out.String())
		sh, err := op.RenderAll(ctx, "cc/"+name, render.Input{Hooks: hc})
		if err != nil {
			t.Fatal(err)
		}
		if len(sh.Parents) == 0 {
			t.Fatalf("shadow run of %s: no parents", name)
		}
		for _, r := range sh.Parents {
			if r.Parent == ns+"/p" && (r.Error != "" || !r.Changed || r.Create != 1) {
				t.Errorf("shadow row %+v", r)
			}
		}
	})

	t.Run("MapController", func(t *testing.T) {
		spec := map[string]any{
			"parentResource":  map[string]any{"apiVersion": mapGroup + "/v1", "resource": "snapschedules"},
			"inputResources":  []any{map[string]any{"apiVersion": mapGroup + "/v1", "resource": "disks"}},
			"outputResources": []any{map[string]any{"apiVersion": mapGroup + "/v1", "resource": "disksnapshots", "updateStrategy": map[string]any{"method": "InPlace"}}},
			"hooks":           map[string]any{"map": map[string]any{"webhook": map[string]any{"url": hook + "/map"}}},
		}
		name := "render-map-" + ns
		ctrl := createController(t, nobody, mapCtlKind, name, spec)
		parent := create(snapSchedulesGVR, map[string]any{"apiVersion": mapGroup + "/v1", "kind": "SnapSchedule",
			"metadata": map[string]any{"name": "daily"}, "spec": map[string]any{"selector": map[string]any{"matchLabels": map[string]any{"backup": "yes"}}}})
		disk := func(name string, labels map[string]any) *unstructured.Unstructured {
			return create(disksGVR, map[string]any{"apiVersion": mapGroup + "/v1", "kind": "Disk", "metadata": map[string]any{"name": name, "labels": labels}})
		}
		d1, d2 := disk("d1", map[string]any{"backup": "yes"}), disk("d2", map[string]any{"backup": "yes"})
		disk("d3", nil)
		yes := true
		output := func(name, key, input string) *unstructured.Unstructured {
			o := &unstructured.Unstructured{Object: map[string]any{"apiVersion": mapGroup + "/v1", "kind": "DiskSnapshot",
				"metadata": map[string]any{"name": name}, "spec": map[string]any{"size": "old"}}}
			o.SetLabels(map[string]string{mapKeyLabel: key})
			o.SetAnnotations(map[string]string{mapInputAnnotation: input})
			o.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: mapGroup + "/v1", Kind: "SnapSchedule", Name: "daily", UID: parent.GetUID(), Controller: &yes}})
			return create(diskSnapshotsGVR, o.Object)
		}
		d1Snap := output("d1-snap", mapKeyOf(d1), mapInputOf(d1))
		gone := &unstructured.Unstructured{Object: map[string]any{"apiVersion": mapGroup + "/v1", "kind": "Disk",
			"metadata": map[string]any{"name": "gone", "namespace": ns, "uid": "gone-uid"}}}
		output("gone-snap", mapKeyOf(gone), mapInputOf(gone))
		recorded()
		res, err := render.Render(ctx, render.Input{Controller: ctrl, Parent: parent, List: op.ClusterLister(), Resolve: op.Resolver(ctx), Hooks: hc})
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		_ = opscli.WriteRender(&out, res)
		t.Logf("metabus render --from-cluster of a MapController parent:\n%s", out.String())
		// One map request per selected Disk, each with that Disk and its
		// outputs only.
		want := map[string]map[string]any{
			mapKeyOf(d1): asJSON(map[string]any{"controller": ctrl.Object, "parent": parent.Object, "mapKey": mapKeyOf(d1), "input": d1.Object,
				"outputs": map[string]any{diskSnapshotType: map[string]any{"d1-snap": d1Snap.Object}}}),
			mapKeyOf(d2): asJSON(map[string]any{"controller": ctrl.Object, "parent": parent.Object, "mapKey": mapKeyOf(d2), "input": d2.Object,
				"outputs": map[string]any{diskSnapshotType: map[string]any{}}}),
		}
		got := map[string]map[string]any{}
		for _, c := range recorded() {
			if c.path != "/map" {
				t.Errorf("a call to %s", c.path)
			}
			got[fmt.Sprint(c.body["mapKey"])] = c.body
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("map requests by key (-want +got):\n%s", diff)
		}
		actions := map[string]string{}
		for _, k := range res.Keys {
			if k.Error != "" {
				t.Errorf("key %s: %s", k.Key, k.Error)
			}
			for _, ch := range k.Changes.Children {
				actions[ch.Name] = ch.Action
			}
		}
		if diff := cmp.Diff(map[string]string{"d1-snap": render.Update, "d2-snap": render.Create, "gone-snap": render.Delete}, actions); diff != "" {
			t.Errorf("output changes (-want +got):\n%s", diff)
		}
		if res.Hook != bus.HookStatus || res.Desired == nil || res.Desired.Status == nil {
			t.Errorf("the per-parent status unit %+v", res.Unit)
		}
		sh, err := op.RenderAll(ctx, "mc/"+name, render.Input{Hooks: hc})
		if err != nil {
			t.Fatal(err)
		}
		var row *opscli.ShadowRow
		for i := range sh.Parents {
			if sh.Parents[i].Parent == ns+"/daily" {
				row = &sh.Parents[i]
			}
		}
		if row == nil || row.Error != "" || !row.Changed || row.Create != 1 || row.Update != 1 || row.Delete != 1 {
			t.Errorf("shadow row of %s/daily: %+v", ns, row)
		}
	})
}
