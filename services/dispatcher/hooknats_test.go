package dispatcher

import (
	"flag"
	"io"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/metabus/metabus/pkg/natsx"
)

func TestHookNATSFlags(t *testing.T) {
	cases := []struct {
		reason string
		args   []string
		// wantErr is part of the parse error, "" for none.
		wantErr    string
		wantPrefix string
		wantConn   natsx.ConnOptions
		wantSet    bool
	}{
		{reason: "defaults: the bus connection, hooks.", wantPrefix: "hooks."},
		{reason: "another prefix", args: []string{"--hook-subject-prefix=team-a.hooks."}, wantPrefix: "team-a.hooks."},
		{reason: "a prefix without its dot", args: []string{"--hook-subject-prefix=hooks"}, wantErr: "ending with a dot"},
		{reason: "the bus's own subjects", args: []string{"--hook-subject-prefix=mc."}, wantErr: "under mc."},
		{reason: "JetStream's API", args: []string{"--hook-subject-prefix=$JS.API."}, wantErr: "under $"},
		{reason: "credentials only: the bus URL with them", args: []string{"--hook-nats-nkey=/seed"}, wantPrefix: "hooks.", wantSet: true,
			wantConn: natsx.ConnOptions{URL: "nats://bus:4222", Name: "metabus-dispatcher-hooks", NKeySeed: "/seed", InboxPrefix: "_INBOX_dispatcher"}},
		{reason: "a server of their own, with TLS", args: []string{"--hook-nats-url=tls://hooks:4222", "--hook-nats-creds=/c", "--hook-nats-ca=/ca",
			"--hook-nats-cert=/crt", "--hook-nats-key=/key"}, wantPrefix: "hooks.", wantSet: true,
			wantConn: natsx.ConnOptions{URL: "tls://hooks:4222", Name: "metabus-dispatcher-hooks", Creds: "/c", CAFile: "/ca", CertFile: "/crt",
				KeyFile: "/key", InboxPrefix: "_INBOX_dispatcher"}},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			var c Config
			fs := flag.NewFlagSet("dispatcher", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			c.RegisterFlags(fs)
			err := fs.Parse(tc.args)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			prefix, err := c.hookSubjectPrefix()
			if err != nil || prefix != tc.wantPrefix {
				t.Errorf("prefix %q (%v), want %q", prefix, err, tc.wantPrefix)
			}
			if c.HookNATS.Set() != tc.wantSet {
				t.Errorf("Set() = %v, want %v", c.HookNATS.Set(), tc.wantSet)
			}
			if tc.wantSet {
				if diff := cmp.Diff(tc.wantConn, c.HookNATS.Options("nats://bus:4222")); diff != "" {
					t.Errorf("connection options (-want +got):\n%s", diff)
				}
			}
		})
	}
}
