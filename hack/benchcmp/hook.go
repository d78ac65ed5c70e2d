package main

import (
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
)

// hookServer is the workload's sync hook on 127.0.0.1, answering at once:
// one ConfigMap named after the parent with data.gen = spec.gen, and status
// {childCount: observed ConfigMaps, observedGen: spec.gen}. It counts calls
// per parent and remembers the gen each parent's last call saw.
type hookServer struct {
	srv   *http.Server
	url   string
	total atomic.Int64

	mu      sync.Mutex
	calls   map[string]int64
	lastGen map[string]int64
}

type hookRequest struct {
	Parent struct {
		Metadata struct {
			Name string `json:"name"`
		} `json:"metadata"`
		Spec struct {
			Gen int64 `json:"gen"`
		} `json:"spec"`
	} `json:"parent"`
	Children map[string]map[string]json.RawMessage `json:"children"`
	// Object and Attachments are a DecoratorController's (B8).
	Object struct {
		Metadata struct {
			Name string `json:"name"`
		} `json:"metadata"`
		Spec struct {
			Gen int64 `json:"gen"`
		} `json:"spec"`
	} `json:"object"`
	Attachments map[string]map[string]json.RawMessage `json:"attachments"`
}

func startHook() (*hookServer, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h := &hookServer{calls: map[string]int64{}, lastGen: map[string]int64{}}
	h.url = "http://" + l.Addr().String() + "/sync"
	h.srv = &http.Server{Handler: http.HandlerFunc(h.serve)}
	go func() { _ = h.srv.Serve(l) }()
	return h, nil
}

func (h *hookServer) close() { _ = h.srv.Close() }

func (h *hookServer) serve(w http.ResponseWriter, r *http.Request) {
	var req hookRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	name, gen := req.Parent.Metadata.Name, req.Parent.Spec.Gen
	h.total.Add(1)
	h.mu.Lock()
	h.calls[name]++
	h.lastGen[name] = gen
	h.mu.Unlock()
	resp := map[string]any{
		"status": map[string]any{
			"childCount":  len(req.Children["ConfigMap.v1"]),
			"observedGen": gen,
		},
		"children": []any{map[string]any{
			"apiVersion": "v1",
			"kind":       "ConfigMap",
			"metadata":   map[string]any{"name": name},
			"data":       map[string]any{"gen": strconv.FormatInt(gen, 10)},
		}},
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
}

// callsOf returns the number of calls for each of names, summed.
func (h *hookServer) callsOf(names ...string) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var n int64
	for _, p := range names {
		n += h.calls[p]
	}
	return n
}

// last returns the gen the parent's most recent call saw.
func (h *hookServer) last(name string) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lastGen[name]
}
