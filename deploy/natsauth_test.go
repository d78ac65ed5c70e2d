package deploy

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/metabus/metabus/internal/testing/testnats"
)

// TestProductionNATSRefusesStrangers (issue #14): the shipped
// nats-server.conf, TLS off (the default), lets in its four nkey users only:
// a client without credentials, or with an nkey it does not list, is
// refused. TestNATSTLS checks the same with TLS on, plus the certificates.
func TestProductionNATSRefusesStrangers(t *testing.T) {
	env := startProductionNATS(t)
	_, stranger := testnats.NewUser(t, t.TempDir(), "stranger")
	strangerKey, err := nats.NkeyOptionFromSeed(stranger)
	if err != nil {
		t.Fatal(err)
	}
	watcherKey, err := nats.NkeyOptionFromSeed(env.seeds["watcher"])
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		reason string
		opts   []nats.Option
		want   string // "" connects
	}{
		{reason: "no credentials", want: "Authorization Violation"},
		{reason: "an nkey the server does not list", opts: []nats.Option{strangerKey}, want: "Authorization Violation"},
		// The control: the refusals above are about credentials, not the URL.
		{reason: "a service's own nkey", opts: []nats.Option{watcherKey}},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			nc, err := nats.Connect(env.url, append(tt.opts, nats.Timeout(5*time.Second), nats.NoReconnect())...)
			if err == nil {
				nc.Close()
			}
			got := ""
			if err != nil {
				got = err.Error()
			}
			if (tt.want == "") != (got == "") || !strings.Contains(got, tt.want) {
				t.Errorf("connect: error %q, want %q", got, tt.want)
			}
		})
	}
}
