// Package helloworldjs_test runs the JavaScript HelloWorld hook with node
// and checks it against the Go one.
package helloworldjs_test

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/metabus/metabus/examples/helloworld"
	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/hookapi"
	"github.com/metabus/metabus/pkg/hooks"
	"github.com/metabus/metabus/sdk/hook"
	"github.com/metabus/metabus/sdk/hook/hooktest"
)

// startHook installs the cloudevents package if it is missing (npm ci,
// from package-lock.json) and runs server.js on a free port until the test
// ends. Without node, or without a registry to install the package from,
// the test is skipped.
func startHook(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not on PATH")
	}
	if _, err := os.Stat(filepath.Join("node_modules", "cloudevents", "package.json")); err != nil {
		npm, err := exec.LookPath("npm")
		if err != nil {
			t.Skip("npm is not on PATH to install the cloudevents package")
		}
		cmd := exec.Command(npm, "ci", "--no-audit", "--no-fund")
		if out, err := cmd.CombinedOutput(); err != nil {
			// No registry to install from (an offline machine) says
			// nothing about the hook.
			t.Skipf("npm ci could not install the cloudevents package: %v\n%s", err, out)
		}
	}
	cmd := exec.Command(node, "server.js")
	cmd.Env = append(os.Environ(), "PORT=0", "HOST=127.0.0.1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	port := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if p, ok := strings.CutPrefix(sc.Text(), "listening on "); ok {
				port <- p
			}
		}
	}()
	select {
	case p := <-port:
		return "http://127.0.0.1:" + p + "/sync"
	case <-time.After(30 * time.Second):
		t.Fatal("server.js did not start listening")
	}
	return ""
}

// goAnswer is the Go hook's answer to the fixture, as JSON.
func goAnswer(t *testing.T, body []byte) any {
	t.Helper()
	var req hook.CompositeRequest
	if err := json.Unmarshal(body, &req); err != nil {
		t.Fatal(err)
	}
	resp, err := helloworld.Sync(context.Background(), &req)
	if err != nil {
		t.Fatal(err)
	}
	return jsonOf(t, resp)
}

func jsonOf(t *testing.T, v any) any {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestJavaScriptHook calls server.js as metabus would, in every mode, and
// through metabus's own hook client, and compares each answer with the Go
// hook's; a request without a parent is refused with 400.
func TestJavaScriptHook(t *testing.T) {
	url := startHook(t)
	body, err := os.ReadFile(filepath.Join("..", "helloworld", "testdata", "sync-request.json"))
	if err != nil {
		t.Fatal(err)
	}
	want := goAnswer(t, body)
	ctx := context.Background()
	cases := []struct {
		reason   string
		body     []byte
		wantCode int
	}{
		{reason: "the fixture is answered as the Go hook answers it", body: body, wantCode: 200},
		{reason: "a request without a parent is the caller's mistake", body: []byte(`{"children":{}}`), wantCode: 400},
	}
	for _, tc := range cases {
		for _, mode := range hooktest.Modes {
			t.Run(tc.reason+"/"+mode.String(), func(t *testing.T) {
				reply, err := hooktest.DoURL(ctx, url, mode, hook.KindSync, tc.body)
				if err != nil {
					t.Fatal(err)
				}
				if reply.Code != tc.wantCode {
					t.Fatalf("code %d (%s), want %d", reply.Code, reply.Message, tc.wantCode)
				}
				if tc.wantCode != 200 {
					return
				}
				var got any
				if err := json.Unmarshal(reply.Data, &got); err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("answer (-go +js):\n%s", diff)
				}
			})
		}
	}
	t.Run("through metabus's hook client", func(t *testing.T) {
		var req hookapi.CompositeSyncRequest
		if err := json.Unmarshal(body, &req); err != nil {
			t.Fatal(err)
		}
		var resp hookapi.CompositeSyncResponse
		call := hooks.Call{Hook: &v1alpha1.Hook{Webhook: &v1alpha1.Webhook{URL: &url}}, Kind: hook.KindSync,
			ControllerType: "CompositeController", ControllerName: "hello-controller", Request: req}
		if err := hooks.New(hooks.Options{}).Do(ctx, call, &resp); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, jsonOf(t, resp), cmp.FilterPath(func(p cmp.Path) bool {
			mi, ok := p.Last().(cmp.MapIndex)
			return ok && len(p) == 2 && (mi.Key().String() == "resyncAfterSeconds" || mi.Key().String() == "finalized")
		}, cmp.Ignore())); diff != "" {
			t.Errorf("decoded answer (-go +js):\n%s", diff)
		}
	})
}
