package main

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Misbehaviours of the hook, for a share of the parents during the fault
// period.
const (
	modeTimeout   = "timeout"           // answers after the webhook timeout
	mode5xx       = "5xx"               // 500 or 503
	mode429       = "429"               // 429 with Retry-After
	modeMalformed = "malformed"         // 200 with a truncated JSON body
	modeOversized = "oversized"         // 200 with a body over the 8MB limit, with Content-Length
	modeChunked   = "oversized-chunked" // the same without Content-Length
)

var modes = []string{modeTimeout, mode5xx, mode429, modeMalformed, modeOversized, modeChunked}

// oversize is the size of an oversized answer: above the dispatcher's
// limit (the bus's 8MB max payload).
const oversize = 9 << 20

// hook is the workload's sync and finalize hook. It wants, for a parent with
// spec {gen, value}: one ConfigMap named like the parent with data {gen,
// value} and a label naming the parent, and status {observedGen: gen,
// value, childCount: observed ConfigMaps}. Finalizing, it asks for no
// children and answers finalized once none is observed.
//
// A share of the parents (chosen by a hash of the name) get a misbehaving
// answer on about half of their calls while misbehave is on, but never more
// than maxConsecutive times in a row, so per-parent backoff stays short and
// convergence is possible once the fault period ends.
type hook struct {
	srv       *http.Server
	url       string
	delay     time.Duration // how long a timeout answer waits
	badPct    int
	misbehave atomic.Bool
	calls     atomic.Int64
	finalizes atomic.Int64

	// catch, when set, is handed the next call (see catchNext).
	catch atomic.Pointer[caughtCall]

	mu          sync.Mutex
	last        map[string]callRecord // by parent name
	consecutive map[string]int
	byMode      map[string]int64
	badParents  map[string]bool
}

const maxConsecutive = 3

// callRecord is what the hook remembers of a parent's calls, to explain a
// parent that did not converge.
type callRecord struct {
	calls  int
	recent []string // the last few calls, oldest first
}

// lastCall describes the last calls for a parent.
func (h *hook) lastCall(name string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	r, ok := h.last[name]
	if !ok {
		return "the hook was never called for it"
	}
	return fmt.Sprintf("hook called %d times, the last: %s", r.calls, strings.Join(r.recent, "; "))
}

type hookRequest struct {
	Parent struct {
		Metadata struct {
			Name string `json:"name"`
		} `json:"metadata"`
		Spec struct {
			Gen   int64  `json:"gen"`
			Value string `json:"value"`
		} `json:"spec"`
	} `json:"parent"`
	Children   map[string]map[string]json.RawMessage `json:"children"`
	Finalizing bool                                  `json:"finalizing"`
}

func startHook(badPct int, delay time.Duration) (*hook, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h := &hook{delay: delay, badPct: badPct, last: map[string]callRecord{}, consecutive: map[string]int{}, byMode: map[string]int64{}, badParents: map[string]bool{}}
	h.url = "http://" + l.Addr().String() + "/sync"
	h.srv = &http.Server{Handler: http.HandlerFunc(h.serve)}
	go func() { _ = h.srv.Serve(l) }()
	return h, nil
}

func (h *hook) close() { _ = h.srv.Close() }

// bad reports whether a parent belongs to the misbehaving share.
func (h *hook) bad(name string) bool {
	f := fnv.New32a()
	_, _ = f.Write([]byte(name))
	return int(f.Sum32()%100) < h.badPct
}

// pick decides how to answer this call: "" is a correct answer.
func (h *hook) pick(name string) string {
	if !h.misbehave.Load() || !h.bad(name) {
		return ""
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.consecutive[name] >= maxConsecutive || rand.IntN(2) == 0 {
		h.consecutive[name] = 0
		return ""
	}
	h.consecutive[name]++
	m := modes[rand.IntN(len(modes))]
	h.byMode[m]++
	h.badParents[name] = true
	return m
}

// caughtCall is a hook call held for the suite: remote is the caller's
// address; the call is answered once release is called.
type caughtCall struct {
	remote  string
	parent  string // the parent the call is about
	caught  chan struct{}
	release func()
	done    chan struct{}
}

// catchNext holds the next sync hook call until the returned call's
// release is called (or 10s pass), and returns it once it arrived, so the
// suite can act on its caller in the middle of the call.
func (h *hook) catchNext(wait time.Duration) (*caughtCall, error) {
	c := &caughtCall{caught: make(chan struct{}), done: make(chan struct{})}
	var once sync.Once
	c.release = func() { once.Do(func() { close(c.done) }) }
	h.catch.Store(c)
	select {
	case <-c.caught:
		return c, nil
	case <-time.After(wait):
		if h.catch.CompareAndSwap(c, nil) {
			return nil, fmt.Errorf("no hook call within %s", wait)
		}
		<-c.caught
		return c, nil
	}
}

// caught takes the pending catch for a sync call (nil for a finalize
// call, or none pending).
func (h *hook) caught(finalizing bool) *caughtCall {
	if finalizing {
		return nil
	}
	return h.catch.Swap(nil)
}

func (h *hook) serve(w http.ResponseWriter, r *http.Request) {
	var req hookRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	// A sync call only: a finalize call's parent is on its way out, and
	// may be gone by the heal with the held answer.
	if c := h.caught(req.Finalizing); c != nil {
		c.remote, c.parent = r.RemoteAddr, req.Parent.Metadata.Name
		close(c.caught)
		select {
		case <-c.done:
		case <-time.After(10 * time.Second):
		}
	}
	h.calls.Add(1)
	if req.Finalizing {
		h.finalizes.Add(1)
	}
	name := req.Parent.Metadata.Name
	m := h.pick(name)
	h.mu.Lock()
	rec := h.last[name]
	rec.calls++
	answer := "ok"
	if m != "" {
		answer = m
	}
	rec.recent = append(rec.recent, fmt.Sprintf("%s gen %d children %d finalizing=%v → %s",
		time.Now().UTC().Format("15:04:05.000"), req.Parent.Spec.Gen, len(req.Children["ConfigMap.v1"]), req.Finalizing, answer))
	if len(rec.recent) > 5 {
		rec.recent = rec.recent[len(rec.recent)-5:]
	}
	h.last[name] = rec
	h.mu.Unlock()
	switch m {
	case modeTimeout:
		select {
		case <-time.After(h.delay):
		case <-r.Context().Done():
			return
		}
	case mode5xx:
		code := http.StatusInternalServerError
		if rand.IntN(2) == 0 {
			code = http.StatusServiceUnavailable
		}
		http.Error(w, "fault suite: injected server error", code)
		return
	case mode429:
		w.Header().Set("Retry-After", strconv.Itoa(1+rand.IntN(3)))
		http.Error(w, "fault suite: injected throttling", http.StatusTooManyRequests)
		return
	case modeMalformed:
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status": {"observedGen": 1, "childCount": `))
		return
	case modeOversized, modeChunked:
		w.Header().Set("Content-Type", "application/json")
		chunked := m == modeChunked
		pad := strings.Repeat("x", 64<<10)
		if !chunked {
			w.Header().Set("Content-Length", strconv.Itoa(len(`{"status":{"pad":"`)+oversize+len(`"}}`)))
		}
		_, _ = w.Write([]byte(`{"status":{"pad":"`))
		for n := 0; n < oversize; n += len(pad) {
			if _, err := w.Write([]byte(pad)); err != nil {
				return
			}
			if chunked {
				w.(http.Flusher).Flush()
			}
		}
		_, _ = w.Write([]byte(`"}}`))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(desired(&req))
}

// desired is the hook's correct answer.
func desired(req *hookRequest) map[string]any {
	observed := len(req.Children["ConfigMap.v1"])
	if req.Finalizing {
		return map[string]any{"children": []any{}, "finalized": observed == 0}
	}
	name, spec := req.Parent.Metadata.Name, req.Parent.Spec
	return map[string]any{
		"status": map[string]any{"observedGen": spec.Gen, "value": spec.Value, "childCount": observed},
		"children": []any{map[string]any{
			"apiVersion": "v1",
			"kind":       "ConfigMap",
			"metadata":   map[string]any{"name": name, "labels": map[string]any{parentLabel: name}},
			"data":       map[string]any{"gen": strconv.FormatInt(spec.Gen, 10), "value": spec.Value},
		}},
	}
}

// misbehaviours returns the injected misbehaviours by mode and how many
// parents got at least one.
func (h *hook) misbehaviours() (map[string]int64, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]int64, len(h.byMode))
	for k, v := range h.byMode {
		out[k] = v
	}
	return out, len(h.badParents)
}
