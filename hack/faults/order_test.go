package main

import (
	"encoding/json"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metabus/metabus/pkg/bus"
)

func TestAppliedLogOrder(t *testing.T) {
	note := func(parent, key string, seq uint64, writes ...bus.Write) bus.Applied {
		return bus.Applied{ParentUID: parent, MapKey: key, WorkSeq: seq, Writes: writes}
	}
	w := func(uid, to string) bus.Write { return bus.Write{UID: uid, To: to} }
	for _, tc := range []struct {
		reason string
		notes  []bus.Applied
		upTo   int64
		want   []string
	}{
		{
			reason: "writes in resourceVersion order carry growing work sequences",
			notes:  []bus.Applied{note("p", "", 10, w("cm", "100"), w("p", "101")), note("p", "", 12, w("cm", "110"))},
		},
		{
			reason: "a desired state written twice (a note per write, then the whole list) and a re-run of the same item are one sequence",
			notes:  []bus.Applied{note("p", "", 10, w("cm", "100")), note("p", "", 10, w("cm", "100"), w("p", "101")), note("p", "", 10, w("p", "105"))},
		},
		{
			reason: "notes arriving late (a cut applier) are ordered by resourceVersion, not arrival",
			notes:  []bus.Applied{note("p", "", 12, w("cm", "110")), note("p", "", 10, w("cm", "100"))},
		},
		{
			reason: "an older desired state written after a newer one is reported",
			notes:  []bus.Applied{note("p", "", 12, w("cm", "110")), note("p", "", 10, w("p", "120"))},
			want:   []string{"parent uid p: the write of p at resourceVersion 120 applied work seq 10 after the write of cm at 110 had applied work seq 12"},
		},
		{
			reason: "writes after the bus lost its data (work sequences start again) are not compared",
			notes:  []bus.Applied{note("p", "", 12, w("cm", "110")), note("p", "", 3, w("cm", "130"))},
			upTo:   120,
		},
		{
			reason: "parents and map keys are ordered apart",
			notes:  []bus.Applied{note("p", "a", 12, w("x", "110")), note("p", "b", 10, w("y", "120")), note("q", "", 5, w("z", "130"))},
		},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			l := &appliedLog{writes: map[writeKey]uint64{}, upTo: tc.upTo}
			for _, n := range tc.notes {
				data, err := json.Marshal(n)
				if err != nil {
					t.Fatal(err)
				}
				l.record(&nats.Msg{Data: data})
			}
			v := violations{}
			l.check(v)
			if diff := cmp.Diff(tc.want, v[invOrder]); diff != "" {
				t.Errorf("violations (-want +got):\n%s", diff)
			}
		})
	}
}

func TestConnOwner(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The listener's peer sees the dialer's local address as remote.
	ownedHere(t, c.LocalAddr().String())
}

// ownedHere checks that connOwner finds this process (among it and pid 1)
// owning the local end addr.
func ownedHere(t *testing.T, addr string) {
	t.Helper()
	pid, err := connOwner(addr, map[int]*proc{os.Getpid(): nil, 1: nil})
	if err != nil {
		t.Fatal(err)
	}
	if pid != os.Getpid() {
		t.Fatalf("owner %d, want this process %d", pid, os.Getpid())
	}
}

// TestConnOwnerPortReused: a port that closed a connection to one peer (its
// end lingering in TIME_WAIT, owned by no process) and then connected to
// another is still found, whichever of the two lines /proc/net/tcp lists
// first.
func TestConnOwnerPortReused(t *testing.T) {
	listen := func() net.Listener {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return l
	}
	first, second := listen(), listen()
	reuse := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
		}); err != nil {
			return err
		}
		return serr
	}}
	old, err := reuse.Dial("tcp", first.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	peer, err := first.Accept()
	if err != nil {
		t.Fatal(err)
	}
	// The dialer closes first, so its end (this port) goes to TIME_WAIT.
	old.Close()
	peer.Close()
	reuse.LocalAddr = old.LocalAddr()
	c, err := reuse.Dial("tcp", second.Addr().String())
	if err != nil {
		t.Skipf("the kernel would not bind %s again: %v", old.LocalAddr(), err)
	}
	defer c.Close()
	ownedHere(t, c.LocalAddr().String())
}

func TestGenRegressions(t *testing.T) {
	type seen struct {
		parent types.UID
		where  string
		gen    int64
		rv     string
	}
	for _, tc := range []struct {
		reason string
		seen   []seen
		want   []string
	}{
		{
			reason: "gens that grow or repeat (a resync) are in order",
			seen:   []seen{{"a", "child", 1, "10"}, {"a", "status", 1, "11"}, {"a", "child", 1, "12"}, {"a", "child", 3, "20"}},
		},
		{
			reason: "a gen going back is an older desired state applied after a newer one",
			seen:   []seen{{"a", "child", 3, "20"}, {"a", "child", 2, "25"}, {"a", "child", 3, "30"}},
			want:   []string{"p (uid a): the child showed gen 2 at resourceVersion 25, after gen 3 at 20"},
		},
		{
			reason: "the child and the status, and parents, are followed apart",
			seen:   []seen{{"a", "child", 3, "20"}, {"a", "status", 2, "21"}, {"b", "child", 1, "22"}},
		},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			tr := &childTracker{gens: map[genKey]genSeen{}}
			for _, s := range tc.seen {
				tr.sawGen(genKey{s.parent, s.where}, "p", s.gen, s.rv)
			}
			got, n := tr.genRegressions()
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("regressions (-want +got):\n%s", diff)
			}
			if n != len(tc.seen) {
				t.Errorf("%d versions looked at, want %d", n, len(tc.seen))
			}
		})
	}
}
