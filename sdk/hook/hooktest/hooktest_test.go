package hooktest_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/metabus/metabus/sdk/hook"
	"github.com/metabus/metabus/sdk/hook/hooktest"
)

// fatalTB records a Fatalf and stops the goroutine, as testing.T does, so
// that a test can check that hooktest fails the test it is given.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func runTB(t *testing.T, f func(tb testing.TB)) string {
	tb := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() { defer close(done); f(tb) }()
	<-done
	return tb.msg
}

// TestCall checks Call's verdicts: the decoded response when every mode
// agrees, a failed test when a mode fails or answers differently.
func TestCall(t *testing.T) {
	cases := []struct {
		reason   string
		h        hook.Handler
		want     *hook.CustomizeResponse
		wantFail string
	}{
		{reason: "every mode answers the same: the decoded response",
			h: hook.Customize(func(ctx context.Context, req *hook.CustomizeRequest) (*hook.CustomizeResponse, error) {
				return &hook.CustomizeResponse{RelatedResources: []hook.RelatedResourceRule{{APIVersion: "v1", Resource: "configmaps", Names: []string{req.Parent.GetName()}}}}, nil
			}),
			want: &hook.CustomizeResponse{RelatedResources: []hook.RelatedResourceRule{{APIVersion: "v1", Resource: "configmaps", Names: []string{"p"}}}}},
		{reason: "a hook that answers a CloudEvent differently from plain JSON fails the test",
			h: hook.Customize(func(ctx context.Context, req *hook.CustomizeRequest) (*hook.CustomizeResponse, error) {
				return &hook.CustomizeResponse{RelatedResources: []hook.RelatedResourceRule{{APIVersion: "v1", Resource: hook.CallFrom(ctx).Mode.String()}}}, nil
			}),
			wantFail: "the binary call answered differently"},
		{reason: "a failing hook fails the test with its code and message",
			h: hook.Customize(func(ctx context.Context, req *hook.CustomizeRequest) (*hook.CustomizeResponse, error) {
				return nil, hook.Throttled(time.Second, "later")
			}),
			wantFail: "plain call answered 429"},
	}
	req := []byte(`{"controller":{},"parent":{"metadata":{"name":"p"}}}`)
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			var got *hook.CustomizeResponse
			msg := runTB(t, func(tb testing.TB) { got = hooktest.Call[hook.CustomizeResponse](tb, tc.h, hook.KindCustomize, req) })
			if tc.wantFail != "" {
				if !strings.Contains(msg, tc.wantFail) {
					t.Errorf("failure %q, want one containing %q", msg, tc.wantFail)
				}
				return
			}
			if msg != "" {
				t.Fatal(msg)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("response (-want +got):\n%s", diff)
			}
		})
	}
}

// TestDoThrottled checks Do's view of a throttled answer in each mode.
func TestDoThrottled(t *testing.T) {
	h := hook.Map(func(ctx context.Context, req *hook.MapRequest) (*hook.MapResponse, error) {
		return nil, hook.Throttled(2*time.Second, "queue full")
	})
	for _, mode := range hooktest.Modes {
		reply, err := hooktest.Do(h, mode, hook.KindMap, []byte(`{"mapKey":"k"}`))
		if err != nil {
			t.Fatal(err)
		}
		got := []any{reply.Code, reply.RetryAfter, strings.Contains(reply.Message, "queue full")}
		if diff := cmp.Diff([]any{429, 2 * time.Second, true}, got); diff != "" {
			t.Errorf("%s: code, retry after, message (-want +got):\n%s", mode, diff)
		}
	}
}
