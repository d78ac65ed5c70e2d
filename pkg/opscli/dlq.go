package opscli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/jsbus"
	"github.com/metabus/metabus/pkg/kindtable"
)

// DLQEntry is one message parked in MC_DLQ.
type DLQEntry struct {
	Seq  uint64    `json:"seq"`
	Time time.Time `json:"time"`
	// Stage is where it died: work (a work item the dispatchers could not
	// settle) or desired (a desired state the appliers could not).
	Stage      string            `json:"stage"`
	Controller bus.ControllerRef `json:"controller"`
	Parent     bus.ObjectRef     `json:"parent"`
	MapKey     string            `json:"mapKey,omitempty"`
	Deliveries int               `json:"deliveries"`
	Reason     string            `json:"reason"`
	// OriginalSubject is the stored subject it was taken from.
	OriginalSubject string `json:"originalSubject"`
	Type            string `json:"type"`
	// Redacted says what MC_DLQ removed from it (Secret data).
	Redacted string `json:"redacted,omitempty"`
	// Body is the parked message (show only).
	Body json.RawMessage `json:"body,omitempty"`
}

// DLQFilter selects entries.
type DLQFilter struct {
	// Controller: "<kind>/<name>" or a name.
	Controller string
	// Parent: "namespace/name" or "name".
	Parent string
	// Stage: "work", "desired" or "".
	Stage string
	// Seqs, if any, are the only entries wanted.
	Seqs []uint64
}

// Empty reports a filter that selects everything.
func (f DLQFilter) Empty() bool {
	return f.Controller == "" && f.Parent == "" && f.Stage == "" && len(f.Seqs) == 0
}

// match reports whether an entry passes the filter. It is pure.
func (f DLQFilter) match(e DLQEntry) (bool, error) {
	if len(f.Seqs) > 0 && !containsSeq(f.Seqs, e.Seq) {
		return false, nil
	}
	if f.Stage != "" && e.Stage != f.Stage {
		return false, nil
	}
	if f.Controller != "" {
		kind, name, err := ParseControllerRef(f.Controller)
		if err != nil {
			return false, err
		}
		if e.Controller.Name != name || (kind != "" && e.Controller.Kind != kind) {
			return false, nil
		}
	}
	if f.Parent != "" {
		ns, name, err := ParseObjectName(f.Parent)
		if err != nil {
			return false, err
		}
		if e.Parent.Namespace != ns || e.Parent.Name != name {
			return false, nil
		}
	}
	return true, nil
}

func containsSeq(seqs []uint64, s uint64) bool {
	for _, x := range seqs {
		if x == s {
			return true
		}
	}
	return false
}

// ParseSeqs reads DLQ entry sequence numbers.
func ParseSeqs(args []string) ([]uint64, error) {
	var out []uint64
	for _, a := range args {
		n, err := strconv.ParseUint(a, 10, 64)
		if err != nil || n == 0 {
			return nil, Usage("%q is not a DLQ entry number (the SEQ column of metabus dlq list)", a)
		}
		out = append(out, n)
	}
	return out, nil
}

// dlqEntry decodes a parked message. It is pure.
func dlqEntry(m storedMsg) DLQEntry {
	h := func(k string) string {
		for hk, v := range m.Header {
			if strings.EqualFold(hk, k) && len(v) > 0 {
				return v[0]
			}
		}
		return ""
	}
	e := DLQEntry{Seq: m.Seq, Time: m.Time, Reason: h("Metabus-Dead-Reason"), OriginalSubject: h("Metabus-Original-Subject"),
		Type: h(bus.TypeHeader), Redacted: h("Metabus-Redacted"), Body: json.RawMessage(m.Data)}
	e.Deliveries, _ = strconv.Atoi(h("Metabus-Deliveries"))
	// mc.dlq.<stage>.<ctrl>.<parent token>
	if parts := strings.Split(m.Subject, "."); len(parts) == 5 {
		e.Stage = parts[2]
	}
	var body struct {
		Controller bus.ControllerRef `json:"controller"`
		Parent     bus.ObjectRef     `json:"parent"`
		MapKey     string            `json:"mapKey"`
	}
	if json.Unmarshal(m.Data, &body) == nil {
		e.Controller, e.Parent, e.MapKey = body.Controller, body.Parent, body.MapKey
	}
	if !json.Valid(m.Data) {
		e.Body = nil
	}
	return e
}

// dlqSubjectFilter narrows the read of MC_DLQ by stage and controller where
// the filter allows it (a bare controller name may be of any kind).
func dlqSubjectFilter(f DLQFilter) string {
	stage, ctrl := "*", "*"
	if f.Stage != "" {
		stage = f.Stage
	}
	if f.Controller != "" {
		if kind, name, err := ParseControllerRef(f.Controller); err == nil && kind != "" {
			ctrl = bus.ControllerID(kind, name)
		}
	}
	return "mc.dlq." + stage + "." + ctrl + ".*"
}

// DLQList reads the entries a filter selects, oldest first (at most limit;
// 0: all).
func (b *Bus) DLQList(ctx context.Context, f DLQFilter, limit int) ([]DLQEntry, error) {
	if f.Stage != "" && f.Stage != bus.WorkStage && f.Stage != bus.DesiredStage {
		return nil, Usage("--stage %q: want work or desired", f.Stage)
	}
	var msgs []storedMsg
	if len(f.Seqs) > 0 {
		s, err := b.JS.Stream(ctx, bus.DLQStream)
		if err != nil {
			return nil, fmt.Errorf("open stream %s: %w", bus.DLQStream, err)
		}
		for _, seq := range f.Seqs {
			m, err := s.GetMsg(ctx, seq)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				return nil, NotFound("no DLQ entry %d", seq)
			}
			if err != nil {
				return nil, fmt.Errorf("read DLQ entry %d: %w", seq, err)
			}
			msgs = append(msgs, storedMsg{Seq: m.Sequence, Subject: m.Subject, Time: m.Time, Data: m.Data, Header: m.Header})
		}
	} else {
		var err error
		if msgs, _, err = scan(ctx, b.JS, bus.DLQStream, dlqSubjectFilter(f), 0, 0); err != nil {
			return nil, err
		}
	}
	var out []DLQEntry
	for _, m := range msgs {
		e := dlqEntry(m)
		ok, err := f.match(e)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, e)
		}
		if limit > 0 && len(out) == limit {
			break
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Seq < out[j].Seq })
	return out, nil
}

// WriteDLQ prints entries as a table.
func WriteDLQ(w io.Writer, now time.Time, entries []DLQEntry) error {
	t := newTable(w, "SEQ", "AGE", "STAGE", "CONTROLLER", "PARENT", "MAP-KEY", "DELIVERIES", "REASON")
	for _, e := range entries {
		t.row(fmt.Sprint(e.Seq), Age(now.Sub(e.Time)), e.Stage, controllerLabel(e.Controller.Kind, e.Controller.Name),
			parentLabel(e.Parent.Namespace, e.Parent.Name), dash(e.MapKey), fmt.Sprint(e.Deliveries), e.Reason)
	}
	return t.flush()
}

// WriteDLQEntry prints one entry in full, its body indented.
func WriteDLQEntry(w io.Writer, now time.Time, e DLQEntry) error {
	fmt.Fprintf(w, "Seq:          %d\n", e.Seq)
	fmt.Fprintf(w, "Parked:       %s (%s ago)\n", e.Time.UTC().Format(time.RFC3339), Age(now.Sub(e.Time)))
	fmt.Fprintf(w, "Stage:        %s\n", e.Stage)
	fmt.Fprintf(w, "Controller:   %s\n", controllerLabel(e.Controller.Kind, e.Controller.Name))
	fmt.Fprintf(w, "Parent:       %s %s (uid %s)\n", e.Parent.Kind, parentLabel(e.Parent.Namespace, e.Parent.Name), e.Parent.UID)
	if e.MapKey != "" {
		fmt.Fprintf(w, "Map key:      %s\n", e.MapKey)
	}
	fmt.Fprintf(w, "Deliveries:   %d\n", e.Deliveries)
	fmt.Fprintf(w, "Reason:       %s\n", e.Reason)
	fmt.Fprintf(w, "Type:         %s\n", e.Type)
	fmt.Fprintf(w, "From subject: %s\n", e.OriginalSubject)
	if e.Redacted != "" {
		fmt.Fprintf(w, "Redacted:     %s\n", e.Redacted)
	}
	if len(e.Body) > 0 {
		var v any
		if json.Unmarshal(e.Body, &v) == nil {
			data, _ := json.MarshalIndent(v, "  ", "  ")
			fmt.Fprintf(w, "Body:\n  %s\n", data)
		}
	}
	return nil
}

// ReplayResult is what replaying one entry did.
type ReplayResult struct {
	Seq    uint64 `json:"seq"`
	Parent string `json:"parent"`
	// Result: "replayed" (a fresh work item was published), "queued" (the
	// parent already had one pending, which does the same), "gone" (the
	// parent or its controller no longer exists: nothing to replay),
	// "failed".
	Result string `json:"result"`
	// Removed says the entry was deleted from MC_DLQ.
	Removed bool   `json:"removed"`
	Error   string `json:"error,omitempty"`
}

// DLQReplay re-derives the work of each entry from the cluster: it reads
// the entry's controller and parent as they are now, and publishes a fresh
// work item for the parent (its map key for a MapController item), as the
// watcher would; the parked message itself is never republished. A replayed
// entry is removed unless keep. An entry whose parent (same UID) or
// controller is gone has nothing to replay and is left for purge.
func (b *Bus) DLQReplay(ctx context.Context, entries []DLQEntry, keep bool) ([]ReplayResult, error) {
	pub := jsbus.Publisher{JS: b.JS}
	stream, err := b.JS.Stream(ctx, bus.DLQStream)
	if err != nil {
		return nil, fmt.Errorf("open stream %s: %w", bus.DLQStream, err)
	}
	var out []ReplayResult
	for _, e := range entries {
		r := ReplayResult{Seq: e.Seq, Parent: parentLabel(e.Parent.Namespace, e.Parent.Name)}
		item, why, err := b.replayItem(ctx, e)
		switch {
		case err != nil:
			r.Result, r.Error = "failed", err.Error()
		case item == nil:
			r.Result, r.Error = "gone", why
		default:
			item.EnqueuedAt = b.now()
			queued, err := pub.PublishWork(ctx, *item)
			switch {
			case err != nil:
				r.Result, r.Error = "failed", err.Error()
			case queued:
				r.Result = "replayed"
			default:
				r.Result = "queued"
			}
		}
		if (r.Result == "replayed" || r.Result == "queued") && !keep {
			if err := stream.DeleteMsg(ctx, e.Seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
				r.Error = fmt.Sprintf("replayed, but removing the entry failed: %v", err)
			} else {
				r.Removed = true
			}
		}
		out = append(out, r)
	}
	return out, nil
}

// replayItem is the fresh work item for an entry's parent, or nil and why
// when there is nothing to replay.
func (b *Bus) replayItem(ctx context.Context, e DLQEntry) (*bus.WorkItem, string, error) {
	k, ok := kindtable.Lookup(e.Controller.Kind)
	if !ok || e.Controller.Name == "" || e.Parent.Name == "" {
		return nil, "", fmt.Errorf("entry %d does not name a controller and parent metabus knows (kind %q)", e.Seq, e.Controller.Kind)
	}
	obj, err := b.Dyn.Resource(k.GVR).Get(ctx, e.Controller.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, "controller " + controllerLabel(e.Controller.Kind, e.Controller.Name) + " is gone", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("get controller %s: %w", e.Controller.Name, err)
	}
	ms, err := b.findParents(ctx, []controllerObj{{Kind: k.Name, Name: obj.GetName(), ID: bus.ControllerID(k.Name, obj.GetName()), Obj: obj}},
		"", e.Parent.Namespace, e.Parent.Name)
	if err != nil {
		return nil, "", err
	}
	for _, m := range ms {
		if m.res.Kind != e.Parent.Kind && e.Parent.Kind != "" {
			continue
		}
		if string(m.parent.GetUID()) != e.Parent.UID {
			return nil, "parent was recreated (new UID): its own syncs cover it", nil
		}
		item := m.item(bus.ReasonReplay, e.MapKey, e.Controller.Weight)
		return &item, "", nil
	}
	return nil, "parent is gone or no longer selected by the controller", nil
}

// WriteReplay prints replay results.
func WriteReplay(w io.Writer, rs []ReplayResult) error {
	t := newTable(w, "SEQ", "PARENT", "RESULT", "REMOVED", "DETAIL")
	for _, r := range rs {
		t.row(fmt.Sprint(r.Seq), r.Parent, r.Result, fmt.Sprint(r.Removed), dash(r.Error))
	}
	return t.flush()
}

// DLQPurge removes entries. An empty filter with all purges the stream.
func (b *Bus) DLQPurge(ctx context.Context, f DLQFilter, all bool) (int, error) {
	stream, err := b.JS.Stream(ctx, bus.DLQStream)
	if err != nil {
		return 0, fmt.Errorf("open stream %s: %w", bus.DLQStream, err)
	}
	if f.Empty() {
		if !all {
			return 0, Usage("purge what? give entry numbers, --controller, --parent or --stage, or --all for every entry")
		}
		before, err := stream.Info(ctx)
		if err != nil {
			return 0, fmt.Errorf("read %s: %w", bus.DLQStream, err)
		}
		if err := stream.Purge(ctx); err != nil {
			return 0, fmt.Errorf("purge %s: %w", bus.DLQStream, err)
		}
		return int(before.State.Msgs), nil
	}
	entries, err := b.DLQList(ctx, f, 0)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range entries {
		if err := stream.DeleteMsg(ctx, e.Seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return n, fmt.Errorf("remove DLQ entry %d: %w", e.Seq, err)
		}
		n++
	}
	return n, nil
}
