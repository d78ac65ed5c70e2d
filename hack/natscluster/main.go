// Command natscluster runs the production NATS topology of internal/testing/testnats
// (nats-server processes from deploy/nats/nats-server.conf and cluster.conf,
// with the services' users and a test admin user) until interrupted, for
// measurements that need an external NATS, e.g. hack/benchcmp's B1 against
// R3 streams:
//
//	go run ./hack/natscluster -dir /tmp/nc &
//	go run ./hack/benchcmp -scenarios B1 -only metabus -metabus-args \
//	  "--external-nats --nats-url=$(cat /tmp/nc/url) --nats-nkey=/tmp/nc/admin.nk --stream-replicas=3"
//
// It writes the client URLs to <dir>/url, and prints the CPU time and
// memory of the nodes every -every and when it stops (SIGINT or SIGTERM).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/metabus/metabus/internal/testing/testnats"
)

func main() {
	var (
		dir, conf, syncInterval string
		nodes                   int
		every                   time.Duration
	)
	flag.StringVar(&dir, "dir", "", "work directory (default: a new temporary directory)")
	flag.StringVar(&conf, "conf", "deploy/nats/nats-server.conf", "nats-server.conf (cluster.conf is read next to it)")
	flag.IntVar(&nodes, "nodes", 0, "nodes (0: as many as cluster.conf routes; 1: one server, no cluster block)")
	flag.StringVar(&syncInterval, "sync-interval", "", "replace the configuration's JetStream sync_interval (e.g. always, 1s, 2m)")
	flag.DurationVar(&every, "every", 10*time.Second, "how often to print the nodes' CPU time and memory")
	flag.Parse()
	if err := run(dir, conf, syncInterval, nodes, every); err != nil {
		fmt.Fprintln(os.Stderr, "natscluster:", err)
		os.Exit(1)
	}
}

func run(dir, conf, syncInterval string, nodes int, every time.Duration) error {
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "natscluster-"); err != nil {
			return err
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	bin, err := testnats.BuildServer(ctx, dir)
	if err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	c, err := testnats.NewCluster(sctx, testnats.ClusterOptions{
		Conf: conf, Dir: dir, Bin: bin, Nodes: nodes, SyncInterval: syncInterval,
		Logf: func(f string, a ...any) { fmt.Printf(f+"\n", a...) },
	})
	if err != nil {
		return err
	}
	defer c.Close()
	if err := os.WriteFile(filepath.Join(dir, "url"), []byte(c.URLs()), 0o644); err != nil {
		return err
	}
	fmt.Printf("%d node(s) up: %s\nadmin seed: %s\nstores and logs: %s\n", len(c.Nodes), c.URLs(), c.Seeds[testnats.AdminUser], dir)
	start := time.Now()
	report := func() {
		cpu, rss, peak := c.Usage()
		fmt.Printf("after %s: nats-server CPU %s in all; RSS MiB %v, peak %v\n",
			time.Since(start).Round(time.Second), cpu.Round(10*time.Millisecond), mib(rss), mib(peak))
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			report()
			for _, e := range c.UnexpectedExits() {
				fmt.Println("unexpected exit:", e)
			}
			return nil
		case <-t.C:
			report()
		}
	}
}

func mib(bs []int64) []int64 {
	out := make([]int64, len(bs))
	for i, b := range bs {
		out[i] = b >> 20
	}
	return out
}
