package main

import (
	"context"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"sigs.k8s.io/yaml"

	"github.com/metabus/metabus/internal/testing/testnats"
	"github.com/metabus/metabus/pkg/hookwire"
)

// TestServesOverNATS runs the command against a NATS server that demands
// an nkey, sends it the binary-mode CloudEvent metabus sends, and checks
// the greeting in the CloudEvent answer; then stops it.
func TestServesOverNATS(t *testing.T) {
	dir := t.TempDir()
	hookPub, hookSeed := testnats.NewUser(t, dir, "hook")
	callerPub, callerSeed := testnats.NewUser(t, dir, "caller")
	s := testnats.Serve(t, &server.Options{Port: -1, Nkeys: []*server.NkeyUser{{Nkey: hookPub}, {Nkey: callerPub}}})

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--nats-url", s.ClientURL(), "--nats-nkey", hookSeed, "--subject", "hooks.t.sync", "--queue", "t"}, io.Discard)
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()

	seed, err := nats.NkeyOptionFromSeed(callerSeed)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(s.ClientURL(), seed)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	req := nats.NewMsg("hooks.t.sync")
	for k, v := range map[string]string{"specversion": "1.0", "id": "u:1", "type": hookwire.EventType(hookwire.HookSync),
		"source": "/apis/metacontroller.k8s.io/v1alpha1/compositecontrollers/hello-controller", "subject": "/apis/example.com/v1/namespaces/hello/helloworlds/your-name"} {
		req.Header.Set(hookwire.HeaderPrefix+k, v)
	}
	req.Header.Set(hookwire.HeaderContentType, hookwire.ContentTypeJSON)
	req.Data = []byte(`{"parent":{"apiVersion":"example.com/v1","kind":"HelloWorld","metadata":{"name":"your-name"},"spec":{"who":"NATS"}},"children":{"Pod.v1":{}}}`)
	var reply *nats.Msg
	deadline := time.Now().Add(10 * time.Second)
	for {
		reply, err = nc.RequestMsg(req, 5*time.Second)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no answer: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // not subscribed yet
	}
	if code := reply.Header.Get(hookwire.HeaderServiceErrorCode); code != "" {
		t.Fatalf("error %s: %s", code, reply.Header.Get(hookwire.HeaderServiceError))
	}
	got := []string{reply.Header.Get("ce-type"), reply.Header.Get("ce-" + hookwire.ExtRequestID)}
	if diff := cmp.Diff([]string{hookwire.ResponseType(hookwire.EventType(hookwire.HookSync)), "u:1"}, got); diff != "" {
		t.Errorf("answer type and requestid (-want +got):\n%s", diff)
	}
	if !strings.Contains(string(reply.Data), `"command":["echo","Hello, NATS!"]`) {
		t.Errorf("answer %s, want the greeting", reply.Data)
	}
}

// TestFlags checks the command line's refusals and defaults.
func TestFlags(t *testing.T) {
	cases := []struct {
		reason  string
		args    []string
		wantErr string
		want    config
	}{
		{reason: "defaults serve the manifest's subject", args: nil,
			want: config{url: nats.DefaultURL, subject: DefaultSubject, queue: DefaultQueue}},
		{reason: "creds and nkey together are ambiguous", args: []string{"--nats-creds", "a", "--nats-nkey", "b"}, wantErr: "give one"},
		{reason: "a certificate needs its key", args: []string{"--nats-cert", "c.pem"}, wantErr: "go together"},
		{reason: "stray arguments are refused", args: []string{"serve"}, wantErr: "unexpected arguments"},
		{reason: "an unknown flag is refused", args: []string{"--port", "1"}, wantErr: "not defined"},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			c, err := parseFlags(tc.args, io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, *c, cmp.AllowUnexported(config{})); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
		})
	}
}

// TestManifestSubject holds the controller's NATS subject to the one the
// command serves by default. That the manifest as a whole is valid is
// checked against the CRD by a real API server, in e2e's
// TestHelloWorldNATS.
func TestManifestSubject(t *testing.T) {
	data, err := os.ReadFile("manifests/controller.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cc struct {
		Spec struct {
			Hooks struct {
				Sync struct {
					NATS struct {
						Subject string `json:"subject"`
					} `json:"nats"`
				} `json:"sync"`
			} `json:"hooks"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(data, &cc); err != nil {
		t.Fatal(err)
	}
	if got := cc.Spec.Hooks.Sync.NATS.Subject; got != DefaultSubject {
		t.Errorf("controller.yaml's hooks.sync.nats.subject = %q, want %q", got, DefaultSubject)
	}
}
