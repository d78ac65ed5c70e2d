package testnats

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const shippedConf = "../../../deploy/nats/nats-server.conf"

// TestCluster runs the test bed's faults against real nats-server processes
// and checks each does what it claims: permissions as shipped, leaders found
// and moved, a partitioned node cut off while the majority goes on, a wiped
// node catching up, a service cut from NATS.
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("builds nats-server and runs three of them")
	}
	c := StartCluster(t, shippedConf)
	if len(c.Nodes) != 3 {
		t.Fatalf("%d nodes, want the shipped cluster.conf's 3", len(c.Nodes))
	}
	// Each request gets its own short deadline (rq): during a leader move
	// a JetStream API request may go unanswered, and must then fail and
	// be retried, not hold the test.
	rq := func() context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		t.Cleanup(cancel)
		return ctx
	}
	long, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	admin, err := c.Connect(AdminUser)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	// Creating the replicated stream and consumer right after the cluster
	// formed can outlast one request's deadline on a loaded machine (the
	// new meta leader still catching its followers up: seen in CI as
	// "context deadline exceeded"), so each is asked again until long ends.
	if err := untilDone(long, func() error {
		_, err := js.CreateStream(rq(), jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}, Replicas: 3})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := untilDone(long, func() error {
		_, err := js.CreateOrUpdateConsumer(rq(), "T", jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckExplicitPolicy, Replicas: 3})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	publish := func(js jetstream.JetStream, n int) error {
		for i := range n {
			_, err := js.Publish(rq(), fmt.Sprintf("t.%d", i), []byte("x"))
			if err != nil {
				return err
			}
		}
		return nil
	}
	if err := publish(js, 10); err != nil {
		t.Fatal(err)
	}

	t.Run("services keep the shipped permissions", func(t *testing.T) {
		nc, err := c.Connect("revisions", nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		rjs, _ := jetstream.New(nc)
		// A refused request gets no reply: it times out.
		_, err = rjs.CreateStream(rq(), jetstream.StreamConfig{Name: "R", Subjects: []string{"r.>"}})
		if err == nil {
			t.Fatal("the revisions user created a stream")
		}
	})

	t.Run("stream and consumer leaders move on stepdown", func(t *testing.T) {
		for _, step := range []struct {
			what   string
			leader func() (string, error)
			down   func() error
		}{
			{"stream", func() (string, error) { return c.StreamLeader(rq(), js, "T") }, func() error { return StepDownStream(rq(), admin, "T") }},
			{"consumer", func() (string, error) { return c.ConsumerLeader(rq(), js, "T", "C") }, func() error { return StepDownConsumer(rq(), admin, "T", "C") }},
		} {
			before, err := step.leader()
			if err != nil {
				t.Fatal(err)
			}
			if err := step.down(); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 30*time.Second, step.what+" leader to move", func() error {
				after, err := step.leader()
				if err != nil {
					return err
				}
				if after == before {
					return fmt.Errorf("still %s", after)
				}
				return nil
			})
		}
	})

	t.Run("the meta leader killed, another takes over", func(t *testing.T) {
		leader, err := c.MetaLeader(rq())
		if err != nil {
			t.Fatal(err)
		}
		i := c.NodeIndex(leader)
		if err := c.Kill(i); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, "a new meta leader", func() error {
			now, err := c.MetaLeader(rq())
			if err != nil {
				return err
			}
			if now == leader {
				return fmt.Errorf("still %s", now)
			}
			return nil
		})
		waitFor(t, 30*time.Second, "a write with one node down", func() error { return publish(js, 1) })
		if err := c.Start(i); err != nil {
			t.Fatal(err)
		}
		if err := c.WaitHealthy(long); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a partitioned node is cut off, the majority goes on", func(t *testing.T) {
		leader, err := c.StreamLeader(rq(), js, "T")
		if err != nil {
			t.Fatal(err)
		}
		i := c.NodeIndex(leader)
		c.Partition(i)
		// A client of the cut node alone: its requests need the others.
		minority, err := nats.Connect(c.Nodes[i].ClientURL(), nkey(t, c, AdminUser), nats.Timeout(3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer minority.Close()
		mjs, _ := jetstream.New(minority)
		var majority []string
		for j, n := range c.Nodes {
			if j != i {
				majority = append(majority, n.ClientURL())
			}
		}
		mnc, err := nats.Connect(strings.Join(majority, ","), nkey(t, c, AdminUser), nats.Timeout(3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer mnc.Close()
		majJS, _ := jetstream.New(mnc)
		waitFor(t, 60*time.Second, "the majority to elect a stream leader and take writes", func() error {
			l, err := c.StreamLeader(rq(), majJS, "T")
			if err != nil {
				return err
			}
			if l == leader {
				return fmt.Errorf("leader still %s", l)
			}
			return publish(majJS, 1)
		})
		_, err = mjs.Publish(rq(), "t.minority", []byte("x"))
		if err == nil {
			t.Fatal("the partitioned node took a write")
		}
		c.Heal(i)
		if err := c.WaitHealthy(long); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a node whose store was wiped catches up", func(t *testing.T) {
		s, err := js.Stream(rq(), "T")
		if err != nil {
			t.Fatal(err)
		}
		want := s.CachedInfo().State.LastSeq
		i := 2
		if err := c.Kill(i); err != nil {
			t.Fatal(err)
		}
		if err := c.Wipe(i); err != nil {
			t.Fatal(err)
		}
		for range 5 {
			waitFor(t, 30*time.Second, "a write with one node down", func() error { return publish(js, 1) })
		}
		want += 5
		if err := c.Start(i); err != nil {
			t.Fatal(err)
		}
		if err := c.WaitHealthy(long); err != nil {
			t.Fatal(err)
		}
		// The wiped node, once the leader, serves every message.
		waitFor(t, 60*time.Second, "the wiped node to lead T", func() error {
			l, err := c.StreamLeader(rq(), js, "T")
			if err != nil {
				return err
			}
			if l != c.Nodes[i].Name {
				if err := StepDownStream(rq(), admin, "T"); err != nil {
					return err
				}
				return fmt.Errorf("leader is %s", l)
			}
			return nil
		})
		info, err := s.Info(rq())
		if err != nil {
			t.Fatal(err)
		}
		if info.State.LastSeq != want || info.State.Msgs != want {
			t.Fatalf("led by the wiped node, T has %d messages up to %d, want %d", info.State.Msgs, info.State.LastSeq, want)
		}
	})

	t.Run("a service cut from NATS", func(t *testing.T) {
		url, err := c.ServiceURL("svc")
		if err != nil {
			t.Fatal(err)
		}
		svc, err := c.Service("svc")
		if err != nil {
			t.Fatal(err)
		}
		nc, err := nats.Connect(url, nkey(t, c, AdminUser), nats.Timeout(3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		sjs, _ := jetstream.New(nc)
		if err := publish(sjs, 1); err != nil {
			t.Fatal(err)
		}
		svc.Cut()
		if err := publish(sjs, 1); err == nil {
			t.Fatal("a cut service published")
		}
		svc.Heal()
		waitFor(t, 30*time.Second, "the service to publish again", func() error { return publish(sjs, 1) })
	})
}

func nkey(t *testing.T, c *Cluster, user string) nats.Option {
	t.Helper()
	opt, err := nats.NkeyOptionFromSeed(c.Seeds[user])
	if err != nil {
		t.Fatal(err)
	}
	return opt
}

func waitFor(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s: %v", timeout, what, err)
		}
		if errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// A port taken between FreePort and the node's bind (by the cluster's own
// proxies or a parallel test: seen in CI) starts the cluster again with new
// ports instead of failing the test that wanted it.
func TestClusterStartsAgainOnTakenPort(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	taken := held.Addr().(*net.TCPAddr).Port
	calls := 0
	orig := freePort
	freePort = func() (int, error) {
		calls++
		if calls == 2 { // the first node's cluster (route) port
			return taken, nil
		}
		return orig()
	}
	defer func() { freePort = orig }()
	c := StartCluster(t, shippedConf)
	if calls <= 3*len(c.Nodes) {
		t.Errorf("FreePort called %d times: the cluster did not start again after its first node's route port was taken", calls)
	}
	if err := c.Healthy(context.Background()); err != nil {
		t.Errorf("the cluster started again is not healthy: %v", err)
	}
}

// untilDone calls f until it succeeds or ctx ends, a second apart, and
// returns f's last error with ctx's.
func untilDone(ctx context.Context, f func() error) error {
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (gave up: %w)", err, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}
