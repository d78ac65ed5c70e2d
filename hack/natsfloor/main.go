// Command natsfloor prints the idle CPU of an embedded JetStream server
// with nothing to do: the floor under every idle figure of an all-in-one
// metabus process (issue 31). It starts the server as the all-in-one does
// (embeddednats.Start, in-process connection only), creates -streams
// memory streams, waits -settle, then reads its own CPU time (getrusage)
// and its voluntary context switches over -window. With -no-access-clock
// it stops nats-server's access-time clock (package ats, a 100 ms ticker
// that every stream store keeps running) once the streams exist, to show
// what that clock costs; the server is then never shut down (stopping a
// store would unregister from the clock again, which panics), the process
// just exits. That is an ablation for measuring, not a setting.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server/ats"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/pkg/embeddednats"
)

func main() {
	var (
		streams = flag.Int("streams", 1, "memory streams to create")
		settle  = flag.Duration("settle", 5*time.Second, "wait before measuring")
		window  = flag.Duration("window", 30*time.Second, "how long to measure")
		noClock = flag.Bool("no-access-clock", false, "stop nats-server's 100 ms access-time clock once the streams exist (an ablation)")
	)
	flag.Parse()
	if err := run(*streams, *settle, *window, *noClock); err != nil {
		fmt.Fprintln(os.Stderr, "natsfloor:", err)
		os.Exit(1)
	}
	os.Exit(0) // no shutdown: see the package comment
}

func run(streams int, settle, window time.Duration, noClock bool) error {
	dir, err := os.MkdirTemp("", "natsfloor")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	s, err := embeddednats.Start(embeddednats.Options{StoreDir: dir, Listen: "-"})
	if err != nil {
		return err
	}
	nc, err := nats.Connect("", nats.InProcessServer(s))
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range streams {
		name := fmt.Sprintf("FLOOR%d", i)
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: jetstream.MemoryStorage}); err != nil {
			return fmt.Errorf("create stream %s: %w", name, err)
		}
	}
	if noClock && streams > 0 {
		// One registration per store: dropping them all stops the
		// clock's goroutine.
		for range streams {
			ats.Unregister()
		}
	}
	time.Sleep(settle)
	cpu0, sw0, err := usage()
	if err != nil {
		return err
	}
	time.Sleep(window)
	cpu1, sw1, err := usage()
	if err != nil {
		return err
	}
	secs := window.Seconds()
	fmt.Printf("streams=%d access-clock-running=%v: %.2f ms CPU per second, %.1f voluntary context switches per second over %s\n",
		streams, streams > 0 && !noClock, float64(cpu1-cpu0)/float64(time.Millisecond)/secs, float64(sw1-sw0)/secs, window)
	return nil
}

// usage returns this process's CPU time (user and system) and its
// voluntary context switches so far.
func usage() (time.Duration, int64, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0, fmt.Errorf("getrusage: %w", err)
	}
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	return cpu, ru.Nvcsw, nil
}
