package jsbus

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/embeddednats"
	"github.com/metabus/metabus/pkg/natsx"
	"github.com/metabus/metabus/pkg/outcome"
)

// pauseChildEnv names the server a paused replica (a child process of
// TestPauseBeyondLease) connects to.
const pauseChildEnv = "METABUS_BUS_PAUSE_CHILD_URL"

// pauseWritesSubject is where the child reports each write: its parent's
// UID and the time it checked its lease before writing, read right before
// the check (a write checked before the freeze and sent after it is the
// window no lease check can close; one checked after the resume must not
// happen).
const pauseWritesSubject = "test.pause.writes"

// TestPauseBeyondLease (issue 24, defect 3): a replica whose process is
// frozen (SIGSTOP: a GC pause, a frozen VM) for longer than its lease
// must, once it runs again, not write anything for the partition another
// replica has taken over meanwhile. Only a check of the lease at the point
// of writing can see this: no timer runs while the process is stopped, and
// when it resumes, handlers may run before any timer does.
func TestPauseBeyondLease(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a child process")
	}
	const lease = time.Second
	o := bus.Options{OwnerLease: lease, WorkAckWait: 2 * time.Second, Partitions: 1}
	s, err := embeddednats.Start(embeddednats.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	nc, js, err := natsx.Connect(natsx.ConnOptions{URL: s.ClientURL(), Name: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := Ensure(ctx, js, o); err != nil {
		t.Fatal(err)
	}
	var w writes
	sub, err := nc.Subscribe(pauseWritesSubject, func(m *nats.Msg) {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.log == nil {
			w.log = map[string][]write{}
		}
		uid, at, _ := strings.Cut(string(m.Data), " ")
		ns, _ := strconv.ParseInt(at, 10, 64)
		w.log[uid] = append(w.log[uid], write{"child", time.Unix(0, ns)})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()

	child := exec.Command(os.Args[0], "-test.run=^TestPausedReplicaChild$", "-test.v")
	child.Env = append(os.Environ(), pauseChildEnv+"="+s.ClientURL())
	child.Stdout, child.Stderr = os.Stderr, os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()

	pub := Publisher{JS: js}
	uids := parentUIDs(64)
	for _, uid := range uids {
		if _, err := pub.PublishWork(ctx, item("c", uid)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 20*time.Second, "the child writes", func() bool { return w.wrote("child") })
	var bw sync.WaitGroup
	bw.Add(1)
	go func() {
		defer bw.Done()
		_ = Consume(ctx, js, ConsumeConfig{Stream: bus.WorkStream, Prefix: bus.WorkConsumerPrefix, Stage: bus.WorkStage,
			PerController: 64, AckWait: 2 * time.Second, Member: "b"}, w.writer("b", 10*time.Second))
	}()
	time.Sleep(2500 * time.Millisecond) // b has joined; the child keeps the partition (it wins it)
	if err := child.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// b takes the partition over and the child's messages after their
	// AckWait: writes at once.
	waitFor(t, 20*time.Second, "b writes", func() bool { return w.wrote("b") })
	time.Sleep(500 * time.Millisecond)
	resumed := time.Now()
	if err := child.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	w.mu.Lock()
	late := 0
	for _, l := range w.log {
		for _, x := range l {
			if x.replica == "child" && x.at.After(resumed) {
				late++
			}
		}
	}
	w.mu.Unlock()
	t.Logf("%d writes of the paused replica checked after it resumed", late)
	for _, v := range w.overlaps() {
		t.Error(v)
	}
	cancel()
	bw.Wait()
}

// TestPausedReplicaChild is the replica TestPauseBeyondLease freezes: it
// consumes MC_WORK with a handler that keeps writing (reporting each write
// on pauseWritesSubject) while its context is live.
func TestPausedReplicaChild(t *testing.T) {
	url := os.Getenv(pauseChildEnv)
	if url == "" {
		t.Skip("run by TestPauseBeyondLease")
	}
	nc, js, err := natsx.Connect(natsx.ConnOptions{URL: url, Name: "paused-child"})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	h := func(ctx context.Context, m jetstream.Msg) outcome.Outcome {
		var it bus.WorkItem
		_ = Decode(m, bus.TypeSyncRequested, &it)
		end := time.Now().Add(10 * time.Second)
		for time.Now().Before(end) {
			// The time is read before the lease check, so a write is
			// reported no later than its check: a freeze (or, under load,
			// a long wait for the CPU) between the check and the clock
			// would otherwise report a write checked before the freeze as
			// checked after it.
			checked := time.Now()
			if ctx.Err() != nil {
				return outcome.Outcome{}
			}
			_ = nc.Publish(pauseWritesSubject, []byte(it.Parent.UID+" "+strconv.FormatInt(checked.UnixNano(), 10)))
			time.Sleep(time.Millisecond)
		}
		return outcome.Done()
	}
	_ = Consume(context.Background(), js, ConsumeConfig{Stream: bus.WorkStream, Prefix: bus.WorkConsumerPrefix, Stage: bus.WorkStage,
		PerController: 64, AckWait: 2 * time.Second, Member: winner("child", "b")}, h)
}
