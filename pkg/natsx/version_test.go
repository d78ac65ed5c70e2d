package natsx

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/metabus/metabus/pkg/embeddednats"
)

// TestBuiltServerVersion: the version written out in BuiltServerVersion
// is the nats-server go.mod requires, which the embedded mode and every
// test run (and deploy/natsversion_test.go holds the images to).
func TestBuiltServerVersion(t *testing.T) {
	if BuiltServerVersion != server.VERSION {
		t.Errorf("BuiltServerVersion is %s, go.mod's nats-server is %s: update it", BuiltServerVersion, server.VERSION)
	}
}

func TestConsumerResetSupported(t *testing.T) {
	for _, tc := range []struct {
		reason, version string
		want            bool
		wantErr         string
	}{
		{reason: "the release go.mod builds", version: BuiltServerVersion, want: true},
		{reason: "the release the images pinned before", version: "2.12.15", want: false},
		{reason: "the minimum itself", version: "2.14.0", want: true},
		{reason: "a patch of the minimum", version: "2.14.3", want: true},
		{reason: "a later minor", version: "2.15.2", want: true},
		{reason: "a later major", version: "3.0.0", want: true},
		{reason: "the last patch of the minor before", version: "2.13.99", want: false},
		{reason: "an older major with a higher minor", version: "1.20.0", want: false},
		{reason: "a release candidate sorts before its release", version: "2.14.0-RC.1", want: false},
		{reason: "a pre-release of a later patch is after the minimum", version: "2.14.1-beta", want: true},
		{reason: "build metadata is ignored", version: "2.14.0+gabcdef", want: true},
		{reason: "numbers compare as numbers, not text", version: "2.100.0", want: true},
		{reason: "not connected: no version", version: "", wantErr: "empty nats-server version"},
		{reason: "garbage", version: "banana", wantErr: `"banana": want MAJOR.MINOR.PATCH`},
		{reason: "two numbers", version: "2.14", wantErr: "want MAJOR.MINOR.PATCH"},
		{reason: "four numbers", version: "2.14.0.1", wantErr: "want MAJOR.MINOR.PATCH"},
		{reason: "a letter in a number", version: "2.1x.0", wantErr: `"1x" is not a number`},
		{reason: "an empty number", version: "2..0", wantErr: `"" is not a number`},
		{reason: "a plus amid the numbers starts build metadata", version: "2.+14.0", wantErr: "want MAJOR.MINOR.PATCH"},
		{reason: "a v prefix is not what a server announces", version: "v2.14.0", wantErr: `"v2" is not a number`},
		{reason: "a dash with nothing after it", version: "2.14.0-", wantErr: "empty pre-release"},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			got, err := ConsumerResetSupported(tc.version)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				if got {
					t.Error("supported despite the error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("supported = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestParseServerVersion(t *testing.T) {
	for _, tc := range []struct {
		reason, in string
		want       ServerVersion
	}{
		{reason: "a release", in: "2.15.2", want: ServerVersion{Major: 2, Minor: 15, Patch: 2}},
		{reason: "a release candidate keeps its pre-release", in: "2.14.0-RC.1", want: ServerVersion{Major: 2, Minor: 14, Pre: "RC.1"}},
		{reason: "build metadata dropped", in: "2.14.0-RC.1+abc", want: ServerVersion{Major: 2, Minor: 14, Pre: "RC.1"}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			got, err := ParseServerVersion(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if s := got.String(); !strings.HasPrefix(tc.in, s) {
				t.Errorf("String() = %q, not the start of %q", s, tc.in)
			}
		})
	}
}

// The minimum stays a release the pinned server is at or after: the
// images and the tests run a server that resets consumers.
func TestBuiltServerResetsConsumers(t *testing.T) {
	if ok, err := ConsumerResetSupported(BuiltServerVersion); err != nil || !ok {
		t.Fatalf("go.mod's nats-server %s cannot reset consumers (%v): the handover tests would not test handovers", BuiltServerVersion, err)
	}
	if want := "nats:" + BuiltServerVersion + "-alpine"; ServerImage != want {
		t.Errorf("ServerImage %q, want %q", ServerImage, want)
	}
}

// errorLines are the error-level entries of logs, with their
// serverVersion and minimumVersion fields.
func errorLines(logs *observer.ObservedLogs) []string {
	var out []string
	for _, e := range logs.FilterLevelExact(zapcore.ErrorLevel).All() {
		f := e.ContextMap()
		out = append(out, fmt.Sprintf("%v %v", f["serverVersion"], f["minimumVersion"]))
	}
	return out
}

// The start-up check against the embedded server, the release go.mod
// builds: connecting logs no error.
func TestConnectChecksEmbeddedServer(t *testing.T) {
	s, err := embeddednats.Start(embeddednats.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	core, logs := observer.New(zap.InfoLevel)
	nc, _, err := Connect(ConnOptions{URL: s.ClientURL(), Name: t.Name(), Logger: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if got := nc.ConnectedServerVersion(); got != BuiltServerVersion {
		t.Errorf("server announces %q, want go.mod's %s", got, BuiltServerVersion)
	}
	if !CheckServer(nc, nil) {
		t.Error("the embedded server reported unable to reset consumers")
	}
	if got := errorLines(logs); len(got) != 0 {
		t.Errorf("errors logged: %v", got)
	}
}

// fakeOldServer speaks just enough of the NATS protocol for a client to
// connect (INFO, then PONG to each PING) while announcing version: a
// server of a release the tests do not build.
func fakeOldServer(t *testing.T, version string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = l.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				fmt.Fprintf(c, "INFO {\"server_id\":\"FAKE\",\"server_name\":\"old-nats\",\"version\":%q,\"proto\":1,\"headers\":true,\"max_payload\":1048576}\r\n", version)
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if strings.HasPrefix(line, "PING") {
						fmt.Fprint(c, "PONG\r\n")
					}
				}
			}()
		}
	}()
	return "nats://" + l.Addr().String()
}

// A server before 2.14: connecting logs one error naming its version and
// the minimum, once per version however many connections see it.
func TestConnectReportsOldServer(t *testing.T) {
	const old = "2.12.15"
	loggedVersions.Delete(old) // -count=N: each run starts unreported
	url := fakeOldServer(t, old)
	core, logs := observer.New(zap.InfoLevel)
	for range 2 {
		nc, _, err := Connect(ConnOptions{URL: url, Name: t.Name(), Logger: zap.New(core)})
		if err != nil {
			t.Fatal(err)
		}
		if CheckServer(nc, nil) {
			t.Error("a 2.12.15 server reported able to reset consumers")
		}
		nc.Close()
	}
	if diff := cmp.Diff([]string{old + " " + MinResetVersion}, errorLines(logs)); diff != "" {
		t.Errorf("errors logged (serverVersion minimumVersion) (-want +got):\n%s", diff)
	}
	for _, e := range logs.FilterLevelExact(zapcore.ErrorLevel).All() {
		for _, says := range []string{"handover", "AckWait", "redelivered"} {
			if !strings.Contains(e.Message, says) {
				t.Errorf("error %q does not say what degrades (%s)", e.Message, says)
			}
		}
	}
}

// An unreadable version is reported too, as unable, with its parse error.
func TestCheckServerVersionGarbage(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	var logged sync.Map
	if checkServerVersion("not-a-version", "n1", zap.New(core), &logged) {
		t.Error("garbage reported able to reset consumers")
	}
	es := logs.FilterLevelExact(zapcore.ErrorLevel).All()
	if len(es) != 1 || es[0].ContextMap()["error"] == nil {
		t.Fatalf("logged %v, want one error with the parse error", es)
	}
}
