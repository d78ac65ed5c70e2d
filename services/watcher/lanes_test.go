package watcher

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestResyncLanes: the order in which the resync pacer gets waiting keys
// of one controller (keys are "<ctrl>/..."; the cases name them without
// the controller).
func TestResyncLanes(t *testing.T) {
	type add struct {
		key, parent string
		prompt      bool
	}
	wave := func(key string) add { return add{key: key, parent: key} }
	fan := func(parent, key string) add { return add{key: parent + "~" + key, parent: parent, prompt: true} }
	cases := []struct {
		reason string
		adds   []add
		want   []string
	}{
		{
			reason: "waves go first in, first out; a key waiting already keeps its place",
			adds:   []add{wave("a"), wave("b"), wave("a")},
			want:   []string{"a", "b"},
		},
		{
			reason: "a real change's fan-out goes before a resync wave queued earlier",
			adds:   []add{wave("a"), wave("b"), fan("p", "1"), fan("p", "2")},
			want:   []string{"p~1", "p~2", "a", "b"},
		},
		{
			reason: "parents of the prompt lane take turns, one key at a time",
			adds:   []add{fan("big", "1"), fan("big", "2"), fan("big", "3"), fan("small", "1")},
			want:   []string{"big~1", "small~1", "big~2", "big~3"},
		},
		{
			reason: "a key waiting in a wave moves to the prompt lane when a real change fans out to it",
			adds:   []add{wave("a"), {key: "p~1", parent: "p"}, fan("p", "1")},
			want:   []string{"p~1", "a"},
		},
		{
			reason: "a key waiting in the prompt lane stays there when a wave reaches it",
			adds:   []add{wave("a"), fan("p", "1"), {key: "p~1", parent: "p"}},
			want:   []string{"p~1", "a"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			q := newResyncLanes()
			for _, a := range tc.adds {
				q.add("c/"+a.key, "c/"+a.parent, a.prompt)
			}
			if got := q.len(); got != len(tc.want) {
				t.Errorf("len = %d, want %d", got, len(tc.want))
			}
			var got []string
			for q.len() > 0 {
				key, shutdown := q.get()
				if shutdown {
					t.Fatal("shut down while keys wait")
				}
				got = append(got, strings.TrimPrefix(key, "c/"))
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("order (-want +got):\n%s", diff)
			}
		})
	}
}

// TestResyncLanesPerController: controllers take turns, and a controller
// the pacer holds back (at its resync backlog) holds no other back.
func TestResyncLanesPerController(t *testing.T) {
	q := newResyncLanes()
	for _, k := range []string{"a/1", "a/2", "a/3", "b/1", "b/2", "c/1"} {
		q.add(k, k, false)
	}
	cases := []struct {
		reason  string
		blocked string
		want    string
	}{
		{"the first controller's first key", "", "a/1"},
		{"then the next controller's", "", "b/1"},
		{"a controller held back is passed over", "c", "a/2"},
		{"its turn comes when it is no longer held back", "a", "c/1"},
		{"the others' turns go on", "", "b/2"},
		{"the last controller with keys", "", "a/3"},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			got, ok := q.take(func(ctrl string) bool { return ctrl != c.blocked })
			if !ok || got != c.want {
				t.Errorf("take = %q, %v; want %q", got, ok, c.want)
			}
		})
	}
	q.add("a/4", "a/4", false)
	if got, ok := q.take(func(string) bool { return false }); ok {
		t.Errorf("take = %q with every controller held back, want nothing", got)
	}
}

// TestResyncLanesShutDown: a waiting get returns when the lanes shut down,
// and nothing is queued after.
func TestResyncLanesShutDown(t *testing.T) {
	q := newResyncLanes()
	done := make(chan bool)
	go func() {
		_, shutdown := q.get()
		done <- shutdown
	}()
	time.Sleep(10 * time.Millisecond)
	q.shutDown()
	select {
	case shutdown := <-done:
		if !shutdown {
			t.Error("get returned a key from empty lanes")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("get did not return on shutdown")
	}
	q.add("a", "a", false)
	if q.len() != 0 {
		t.Error("a key was queued after shutdown")
	}
}
