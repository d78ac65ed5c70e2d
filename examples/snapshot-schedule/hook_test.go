// Package snapshotschedule_test runs the example's Python hook (hook.py)
// with sample map and tombstone requests and checks its answers. The e2e
// suite (e2e/mapcontroller_test.go) runs it under metabus as well.
package snapshotschedule_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"
)

const snapshotType = "PVCSnapshot.ctl.example.com/v1"

// startHook runs hook.py on a free loopback port until the test ends.
func startHook(t *testing.T) string {
	t.Helper()
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 is needed to test the example's hook: %v", err)
	}
	cmd := exec.Command(python, "hook.py", "--host", "127.0.0.1", "--port", "0")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("hook.py stderr:\n%s", stderr.String())
		}
	})
	line := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(out)
		if s.Scan() {
			line <- s.Text()
		}
		close(line)
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case l := <-line:
		url, ok := strings.CutPrefix(l, "listening on ")
		if !ok {
			t.Fatalf("hook.py said %q, want its address", l)
		}
		return url
	case <-time.After(20 * time.Second):
		t.Fatalf("hook.py did not start in 20s: %s", stderr.String())
	}
	return ""
}

// post sends body to the hook's path and decodes the answer.
func post(t *testing.T, url, path string, body []byte) (int, map[string]any) {
	t.Helper()
	resp, err := http.Post(url+path, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("%s answered %d with a body that is not JSON: %v", path, resp.StatusCode, err)
	}
	return resp.StatusCode, out
}

// snapshot is an observed PVCSnapshot of claim, created age ago.
func snapshot(name, claim string, age time.Duration) map[string]any {
	return map[string]any{
		"apiVersion": "ctl.example.com/v1", "kind": "PVCSnapshot",
		"metadata": map[string]any{
			"name": name, "namespace": "apps",
			"creationTimestamp": time.Now().Add(-age).UTC().Format(time.RFC3339),
			"labels":            map[string]any{"metacontroller.k8s.io/map-key": "k"},
		},
		"spec": map[string]any{"source": map[string]any{"persistentVolumeClaimName": claim}},
	}
}

// request is a map request (with input) or a tombstone request (without)
// of the schedule db-snapshots (interval 1h, retention 3h) for claim
// data-0, showing observed.
func request(withInput bool, observed ...map[string]any) []byte {
	outs := map[string]any{}
	for _, o := range observed {
		outs[o["metadata"].(map[string]any)["name"].(string)] = o
	}
	req := map[string]any{
		"controller": map[string]any{"kind": "MapController", "metadata": map[string]any{"name": "snapshot-schedule"}},
		"parent": map[string]any{
			"apiVersion": "ctl.example.com/v1", "kind": "SnapshotSchedule",
			"metadata": map[string]any{"name": "db-snapshots", "namespace": "apps"},
			"spec":     map[string]any{"selector": map[string]any{"matchLabels": map[string]any{"app": "db"}}, "interval": "1h", "retention": "3h"},
		},
		"mapKey":  "k",
		"outputs": map[string]any{snapshotType: outs},
	}
	if withInput {
		req["input"] = map[string]any{
			"apiVersion": "v1", "kind": "PersistentVolumeClaim",
			"metadata": map[string]any{"name": "data-0", "namespace": "apps", "labels": map[string]any{"app": "db"}},
		}
	}
	b, _ := json.Marshal(req)
	return b
}

// currentName is the name of the snapshot of data-0 for the hour at t.
func currentName(t time.Time) string {
	return "data-0-" + t.UTC().Truncate(time.Hour).Format("20060102-150405")
}

// names are the names of the answer's outputs, sorted, and checks each
// one is a PVCSnapshot.
func names(resp map[string]any) ([]string, error) {
	outs, ok := resp["outputs"].([]any)
	if !ok {
		return nil, fmt.Errorf("outputs is %v, want a list", resp["outputs"])
	}
	var ns []string
	for _, o := range outs {
		m := o.(map[string]any)
		if m["apiVersion"] != "ctl.example.com/v1" || m["kind"] != "PVCSnapshot" {
			return nil, fmt.Errorf("output %v is not a PVCSnapshot", m)
		}
		ns = append(ns, m["metadata"].(map[string]any)["name"].(string))
	}
	sort.Strings(ns)
	return ns, nil
}

func TestHook(t *testing.T) {
	url := startHook(t)
	before := time.Now()
	// The hook reads the clock: the current hour may turn during the test.
	isCurrent := func(n string) bool { return n == currentName(before) || n == currentName(time.Now()) }
	tests := []struct {
		name  string
		path  string
		body  []byte
		code  int
		check func(resp map[string]any) error
	}{{
		name: "first map call takes this hour's snapshot",
		path: "/map", body: request(true), code: 200,
		check: func(resp map[string]any) error {
			ns, err := names(resp)
			if err != nil {
				return err
			}
			if len(ns) != 1 || !isCurrent(ns[0]) {
				return fmt.Errorf("outputs %v, want this hour's snapshot %s", ns, currentName(before))
			}
			out := resp["outputs"].([]any)[0].(map[string]any)
			src := out["spec"].(map[string]any)["source"].(map[string]any)
			if src["persistentVolumeClaimName"] != "data-0" {
				return fmt.Errorf("snapshot source %v, want data-0", src)
			}
			if l := out["metadata"].(map[string]any)["labels"].(map[string]any); l["ctl.example.com/snapshot-schedule"] != "db-snapshots" {
				return fmt.Errorf("labels %v", l)
			}
			// Called again when the next hour starts, at the latest.
			if s, _ := resp["resyncAfterSeconds"].(float64); s < 1 || s > 3600 {
				return fmt.Errorf("resyncAfterSeconds %v, want within the hour", resp["resyncAfterSeconds"])
			}
			return nil
		},
	}, {
		name: "map keeps the snapshots within the retention and drops the older ones",
		path: "/map",
		body: request(true,
			snapshot(currentName(before), "data-0", time.Minute),
			snapshot("data-0-two-hours-ago", "data-0", 2*time.Hour),
			snapshot("data-0-four-hours-ago", "data-0", 4*time.Hour)),
		code: 200,
		check: func(resp map[string]any) error {
			ns, err := names(resp)
			if err != nil {
				return err
			}
			if len(ns) != 2 || ns[1] != "data-0-two-hours-ago" || !isCurrent(ns[0]) {
				return fmt.Errorf("outputs %v, want this hour's and the two-hour-old snapshot", ns)
			}
			// The two-hour-old one expires within the hour: 3h - 2h.
			if s, _ := resp["resyncAfterSeconds"].(float64); s < 1 || s > 3600 {
				return fmt.Errorf("resyncAfterSeconds %v", resp["resyncAfterSeconds"])
			}
			return nil
		},
	}, {
		name: "tombstone keeps the snapshots of a gone claim within the retention",
		path: "/tombstone",
		body: request(false,
			snapshot("data-0-young", "data-0", 10*time.Minute),
			snapshot("data-0-old", "data-0", 5*time.Hour)),
		code: 200,
		check: func(resp map[string]any) error {
			ns, err := names(resp)
			if err != nil {
				return err
			}
			if strings.Join(ns, ",") != "data-0-young" {
				return fmt.Errorf("kept %v, want data-0-young only", ns)
			}
			return nil
		},
	}, {
		name: "tombstone lets them go once expired: an empty list, not null",
		path: "/tombstone",
		body: request(false, snapshot("data-0-old", "data-0", 5*time.Hour)),
		code: 200,
		check: func(resp map[string]any) error {
			ns, err := names(resp)
			if err != nil {
				return err
			}
			if len(ns) != 0 {
				return fmt.Errorf("kept %v, want none", ns)
			}
			return nil
		},
	}, {
		name: "a body that is not JSON is a bad request",
		path: "/map", body: []byte(`{"parent": `), code: 400,
	}, {
		name: "a map request without input is a bad request",
		path: "/map", body: request(false), code: 400,
	}, {
		name: "no hook elsewhere",
		path: "/sync", body: request(true), code: 404,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, resp := post(t, url, tt.path, tt.body)
			if code != tt.code {
				t.Fatalf("status %d, want %d (answer %v)", code, tt.code, resp)
			}
			if tt.check != nil {
				if err := tt.check(resp); err != nil {
					t.Error(err)
				}
			}
		})
	}
}
