package deploy

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/metabus/metabus/internal/testing/testnats"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/jsbus"
	"github.com/metabus/metabus/pkg/natsx"
	"github.com/metabus/metabus/pkg/opscli"
)

// TestNATSCLIAsOperator runs the nats CLI's read commands as the read-only
// operator user, and its DLQ purge as operator-admin, against a
// nats-server loaded from the shipped nats-server.conf, with metabus's
// streams, consumers and lease bucket in place. It needs the nats CLI on
// PATH and is skipped without it (go install
// github.com/nats-io/natscli/nats@latest).
func TestNATSCLIAsOperator(t *testing.T) {
	cliPath, err := exec.LookPath("nats")
	if err != nil {
		t.Skip("the nats CLI is not on PATH")
	}
	p := testnats.StartProduction(t, filepath.Join("nats", "nats-server.conf"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc, js, err := natsx.Connect(natsx.ConnOptions{URL: p.URL, NKeySeed: p.Seeds["watcher"], InboxPrefix: natsx.ServiceInboxPrefix("watcher")})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := jsbus.Ensure(ctx, js, bus.Options{Partitions: 2}); err != nil {
		t.Fatal(err)
	}
	// A DLQ entry and a lease, as the dispatcher writes them.
	dnc, djs, err := natsx.Connect(natsx.ConnOptions{URL: p.URL, NKeySeed: p.Seeds["dispatcher"], InboxPrefix: natsx.ServiceInboxPrefix("dispatcher")})
	if err != nil {
		t.Fatal(err)
	}
	defer dnc.Close()
	if _, err := djs.PublishMsg(ctx, &nats.Msg{Subject: bus.DLQSubject("work", "cc-x", "u1"), Data: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	kv, err := djs.KeyValue(ctx, bus.OwnersBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "member.work.d1", []byte("d1")); err != nil {
		t.Fatal(err)
	}
	run := func(user string, args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, cliPath, append([]string{"--server", p.URL, "--nkey", p.Seeds[user], "--inbox-prefix", opscli.InboxPrefix, "--timeout", "3s"}, args...)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"stream", "ls", "--names"}, bus.DLQStream},
		{[]string{"stream", "info", bus.WorkStream}, bus.WorkStream},
		{[]string{"consumer", "ls", bus.WorkStream, "--names"}, bus.PartitionConsumerName(bus.WorkConsumerPrefix, 2, 0)},
		{[]string{"consumer", "info", bus.WorkStream, bus.PartitionConsumerName(bus.WorkConsumerPrefix, 2, 1)}, "partition 1 of 2"},
		{[]string{"stream", "get", bus.DLQStream, "1"}, "mc.dlq.work.cc-x.u1"},
		{[]string{"kv", "ls", bus.OwnersBucket}, "member.work.d1"},
		{[]string{"kv", "get", bus.OwnersBucket, "member.work.d1", "--raw"}, "d1"},
	} {
		out, err := run("operator", c.args...)
		if err != nil || !strings.Contains(out, c.want) {
			t.Errorf("nats %s as operator: %v\n%s", strings.Join(c.args, " "), err, out)
		}
	}
	if out, err := run("operator", "stream", "purge", bus.DLQStream, "-f"); err == nil {
		t.Errorf("the read-only operator purged MC_DLQ:\n%s", out)
	}
	if out, err := run("operator-admin", "stream", "purge", bus.DLQStream, "-f"); err != nil {
		t.Errorf("nats stream purge MC_DLQ as operator-admin: %v\n%s", err, out)
	}
	if info, err := js.Stream(ctx, bus.DLQStream); err != nil || info.CachedInfo().State.Msgs != 0 {
		t.Errorf("MC_DLQ after the purge: %v", err)
	}
}
