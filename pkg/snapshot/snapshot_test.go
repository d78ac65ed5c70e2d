package snapshot

import (
	"context"
	"errors"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/metabus/metabus/pkg/bus"
)

// fakeSource answers with a scripted sequence of results; the last one
// repeats. It records every call.
type fakeSource struct {
	mu     sync.Mutex
	script []step
	calls  []time.Time
	reqs   []Request
	// onCall runs after each call is recorded (outside the lock).
	onCall func(n int)
}

type step struct {
	result string
	err    error
}

func (f *fakeSource) Snapshot(_ context.Context, req Request) (*Response, error) {
	f.mu.Lock()
	f.calls = append(f.calls, time.Now())
	f.reqs = append(f.reqs, req)
	n := len(f.calls)
	s := f.script[min(n-1, len(f.script)-1)]
	onCall := f.onCall
	f.mu.Unlock()
	if onCall != nil {
		onCall(n)
	}
	if s.err != nil {
		return nil, s.err
	}
	// Message tells responses apart.
	return &Response{Result: s.result, Message: "call " + strconv.Itoa(n)}, nil
}

func (f *fakeSource) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

func testRequest() Request {
	return Request{
		Controller:          bus.ControllerRef{Kind: "CompositeController", Name: "hello.example", UID: "cc-uid"},
		ParentUID:           "p-uid",
		MinResourceVersions: map[string]string{"example.com/things": "42"},
	}
}

func TestFetch(t *testing.T) {
	errBoom := errors.New("boom")
	cases := []struct {
		reason     string
		script     []step
		wait       time.Duration
		wantResult string
		wantErr    error
		wantCalls  int // 0: at least 2
		// minElapsed is a lower bound on how long Fetch takes.
		minElapsed time.Duration
	}{
		{reason: "OK at once: one call", script: []step{{result: OK}}, wait: 5 * time.Second, wantResult: OK, wantCalls: 1},
		{reason: "Retry twice, then OK", script: []step{{result: Retry}, {result: Retry}, {result: OK}}, wait: 5 * time.Second, wantResult: OK, wantCalls: 3, minElapsed: 60 * time.Millisecond},
		{reason: "NotFound is final", script: []step{{result: NotFound}}, wait: 5 * time.Second, wantResult: NotFound, wantCalls: 1},
		{reason: "ControllerGone is final", script: []step{{result: ControllerGone}}, wait: 5 * time.Second, wantResult: ControllerGone, wantCalls: 1},
		{reason: "Invalid is final", script: []step{{result: Retry}, {result: Invalid}}, wait: 5 * time.Second, wantResult: Invalid, wantCalls: 2},
		{reason: "an unknown result is not retried", script: []step{{result: "weird"}}, wait: 5 * time.Second, wantResult: "weird", wantCalls: 1},
		{reason: "Retry until the wait expires returns the Retry", script: []step{{result: Retry}}, wait: 150 * time.Millisecond, wantResult: Retry, minElapsed: 150 * time.Millisecond},
		{reason: "no wait: a Retry is returned at once", script: []step{{result: Retry}}, wait: 0, wantResult: Retry, wantCalls: 1},
		{reason: "an error is returned at once", script: []step{{err: errBoom}}, wait: 5 * time.Second, wantErr: errBoom, wantCalls: 1},
		{reason: "an error after Retries is returned", script: []step{{result: Retry}, {err: errBoom}}, wait: 5 * time.Second, wantErr: errBoom, wantCalls: 2},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			src := &fakeSource{script: tc.script}
			req := testRequest()
			begin := time.Now()
			resp, err := Fetch(context.Background(), src, req, tc.wait)
			elapsed := time.Since(begin)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || resp != nil {
					t.Fatalf("%s: Fetch = %+v, %v; want nil, %v", tc.reason, resp, err, tc.wantErr)
				}
			} else {
				if err != nil {
					t.Fatalf("%s: Fetch: %v", tc.reason, err)
				}
				if resp.Result != tc.wantResult {
					t.Fatalf("%s: result %q, want %q", tc.reason, resp.Result, tc.wantResult)
				}
			}
			n := src.count()
			if tc.wantCalls > 0 && n != tc.wantCalls {
				t.Errorf("%s: %d calls, want %d", tc.reason, n, tc.wantCalls)
			}
			if tc.wantCalls == 0 && n < 2 {
				t.Errorf("%s: %d calls, want several", tc.reason, n)
			}
			if resp != nil && resp.Message != "call "+strconv.Itoa(n) {
				t.Errorf("%s: returned %q, want the last answer (call %d)", tc.reason, resp.Message, n)
			}
			if elapsed < tc.minElapsed {
				t.Errorf("%s: took %s, want at least %s", tc.reason, elapsed, tc.minElapsed)
			}
			// Generous: the longest single back-off is 640ms.
			if elapsed > tc.wait+2*time.Second {
				t.Errorf("%s: took %s with wait %s", tc.reason, elapsed, tc.wait)
			}
			for i, r := range src.reqs {
				if !reflect.DeepEqual(r, req) {
					t.Errorf("%s: call %d got request %+v, want %+v", tc.reason, i+1, r, req)
				}
			}
		})
	}
}

func TestFetchBacksOff(t *testing.T) {
	src := &fakeSource{script: []step{{result: Retry}, {result: Retry}, {result: Retry}, {result: Retry}, {result: Retry}, {result: OK}}}
	resp, err := Fetch(context.Background(), src, testRequest(), 10*time.Second)
	if err != nil || resp.Result != OK {
		t.Fatalf("Fetch = %+v, %v", resp, err)
	}
	if len(src.calls) != 6 {
		t.Fatalf("%d calls, want 6", len(src.calls))
	}
	// Delays double from 20ms: timers never fire early, so each gap is at
	// least its nominal delay.
	want := 20 * time.Millisecond
	for i := 1; i < len(src.calls); i++ {
		if gap := src.calls[i].Sub(src.calls[i-1]); gap < want {
			t.Errorf("gap before call %d = %s, want >= %s", i+1, gap, want)
		}
		want *= 2
	}
}

// Fetch documents that it waits "for at most wait in total"; its back-off
// sleeps are not clipped to the deadline.
func TestFetchRespectsWait(t *testing.T) {
	src := &fakeSource{script: []step{{result: Retry}}}
	const wait = 150 * time.Millisecond
	begin := time.Now()
	resp, err := Fetch(context.Background(), src, testRequest(), wait)
	elapsed := time.Since(begin)
	if err != nil || resp.Result != Retry {
		t.Fatalf("Fetch = %+v, %v", resp, err)
	}
	if elapsed > wait+100*time.Millisecond {
		t.Errorf("Fetch took %s with wait %s (%d attempts)", elapsed, wait, src.count())
	}
}

func TestFetchContextCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	src := &fakeSource{script: []step{{result: Retry}}}
	src.onCall = func(n int) {
		if n == 2 {
			cancel()
		}
	}
	begin := time.Now()
	resp, err := Fetch(ctx, src, testRequest(), 30*time.Second)
	if !errors.Is(err, context.Canceled) || resp != nil {
		t.Fatalf("Fetch = %+v, %v; want nil, context.Canceled", resp, err)
	}
	if n := src.count(); n != 2 {
		t.Errorf("%d calls, want 2 (no call after cancel)", n)
	}
	if d := time.Since(begin); d > 2*time.Second {
		t.Errorf("Fetch took %s to notice the cancel", d)
	}
}
