package opscli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/metabus/metabus/pkg/bus"
)

// ExplainOptions name the parent.
type ExplainOptions struct {
	// Object is "namespace/name" or "name".
	Object string
	// Controller and Resource disambiguate a name several controllers'
	// parents share.
	Controller, Resource string
}

// Explanation is everything known about why a parent is where it is.
type Explanation struct {
	Time       time.Time  `json:"time"`
	Controller string     `json:"controller"`
	Parent     ParentInfo `json:"parent"`
	// Syncs are the dispatchers' last records of the parent (one per map
	// key, and beside a last sync merged into an earlier call, that call),
	// Applies the appliers', newest first; Writes name what the applies
	// wrote.
	Syncs   []bus.Record `json:"syncs"`
	Applies []bus.Record `json:"applies"`
	Writes  []WriteInfo  `json:"writes,omitempty"`
	// Pending is what waits on the bus for the parent.
	Pending Pending     `json:"pending"`
	Events  []EventInfo `json:"events"`
	Notes   []string    `json:"notes,omitempty"`
}

// ParentInfo is the parent as the API server has it now.
type ParentInfo struct {
	APIVersion         string     `json:"apiVersion"`
	Kind               string     `json:"kind"`
	Namespace          string     `json:"namespace,omitempty"`
	Name               string     `json:"name"`
	UID                string     `json:"uid"`
	ResourceVersion    string     `json:"resourceVersion"`
	Generation         int64      `json:"generation,omitempty"`
	ObservedGeneration *int64     `json:"observedGeneration,omitempty"`
	Finalizers         []string   `json:"finalizers,omitempty"`
	Deleting           *time.Time `json:"deleting,omitempty"`
}

// WriteInfo is one write of an apply, with the object's name where it
// still exists.
type WriteInfo struct {
	WorkSeq uint64 `json:"workSeq"`
	Object  string `json:"object"`
	UID     string `json:"uid"`
	From    string `json:"from,omitempty"`
	To      string `json:"to"`
}

// Pending is what the bus holds for a parent.
type Pending struct {
	Work     []PendingItem `json:"work"`
	Desired  []PendingItem `json:"desired"`
	Schedule []PendingItem `json:"schedule"`
	DLQ      []DLQEntry    `json:"dlq"`
}

// PendingItem is one stored message of the parent.
type PendingItem struct {
	Seq      uint64    `json:"seq"`
	Time     time.Time `json:"time"`
	MapKey   string    `json:"mapKey,omitempty"`
	Reason   string    `json:"reason,omitempty"`
	Attempt  int       `json:"attempt,omitempty"`
	InFlight bool      `json:"inFlight,omitempty"`
	// At is when a schedule fires.
	At string `json:"at,omitempty"`
}

// EventInfo is one Kubernetes Event on the parent.
type EventInfo struct {
	Type    string    `json:"type"`
	Reason  string    `json:"reason"`
	Message string    `json:"message"`
	Count   int32     `json:"count"`
	Last    time.Time `json:"last"`
	Source  string    `json:"source,omitempty"`
}

// Explain gathers, for one parent: its controller, the replicas' last
// records of its syncs (hook calls and answer) and applies (writes), what
// waits for it on the bus, and its Events.
func (b *Bus) Explain(ctx context.Context, o ExplainOptions) (*Explanation, error) {
	m, err := b.oneParent(ctx, o.Controller, o.Resource, o.Object)
	if err != nil {
		return nil, err
	}
	p := m.parent
	ex := &Explanation{Time: b.now(), Controller: controllerLabel(m.ctrl.Kind, m.ctrl.Name), Parent: parentInfo(p)}
	ctrlID, uid := m.ctrl.ID, string(p.GetUID())
	owners, err := readOwnership(ctx, b.JS)
	if err != nil {
		return nil, err
	}
	replies, notes, err := b.askReplicas(ctx, owners, bus.InspectRequest{Controller: ctrlID, ParentUID: uid})
	if err != nil {
		return nil, err
	}
	ex.Notes = append(ex.Notes, notes...)
	for _, r := range replies {
		for _, rec := range r.Records {
			if r.Stage == bus.WorkStage {
				ex.Syncs = append(ex.Syncs, rec)
			} else {
				ex.Applies = append(ex.Applies, rec)
			}
		}
	}
	sortRecords(ex.Syncs)
	sortRecords(ex.Applies)
	if len(ex.Applies) > 0 {
		names := b.childNames(ctx, m)
		names[uid] = "parent " + parentLabel(p.GetNamespace(), p.GetName())
		ex.Writes = namedWrites(ex.Applies, names)
	}
	if ex.Pending, err = b.pending(ctx, m); err != nil {
		return nil, err
	}
	if ex.Events, err = b.events(ctx, p); err != nil {
		return nil, err
	}
	return ex, nil
}

func parentInfo(p *unstructured.Unstructured) ParentInfo {
	pi := ParentInfo{
		APIVersion: p.GetAPIVersion(), Kind: p.GetKind(), Namespace: p.GetNamespace(), Name: p.GetName(),
		UID: string(p.GetUID()), ResourceVersion: p.GetResourceVersion(), Generation: p.GetGeneration(),
		Finalizers: p.GetFinalizers(),
	}
	if og, found, err := unstructured.NestedInt64(p.Object, "status", "observedGeneration"); found && err == nil {
		pi.ObservedGeneration = &og
	}
	if d := p.GetDeletionTimestamp(); d != nil {
		t := d.Time
		pi.Deleting = &t
	}
	return pi
}

// sortRecords orders records newest first.
func sortRecords(rs []bus.Record) {
	sort.Slice(rs, func(i, j int) bool { return rs[i].Started.After(rs[j].Started) })
}

// namedWrites lists the writes of apply records with the names of the
// objects written. It is pure.
func namedWrites(applies []bus.Record, names map[string]string) []WriteInfo {
	var out []WriteInfo
	for _, r := range applies {
		for _, w := range r.Writes {
			name := names[w.UID]
			if name == "" {
				name = "(gone or not a child)"
			}
			out = append(out, WriteInfo{WorkSeq: r.WorkSeq, Object: name, UID: w.UID, From: w.From, To: w.To})
		}
	}
	return out
}

// childNames maps the UIDs of the parent's owned objects to their names.
func (b *Bus) childNames(ctx context.Context, m *parentMatch) map[string]string {
	out := map[string]string{}
	uid := string(m.parent.GetUID())
	for _, res := range m.plan.Owned {
		ri := b.Dyn.Resource(res.GVR)
		var l *unstructured.UnstructuredList
		var err error
		if res.Namespaced && m.parent.GetNamespace() != "" {
			l, err = ri.Namespace(m.parent.GetNamespace()).List(ctx, metav1.ListOptions{})
		} else {
			l, err = ri.List(ctx, metav1.ListOptions{})
		}
		if err != nil {
			continue // names are a courtesy
		}
		for i := range l.Items {
			o := &l.Items[i]
			for _, ref := range o.GetOwnerReferences() {
				if string(ref.UID) == uid {
					out[string(o.GetUID())] = res.Kind + " " + parentLabel(o.GetNamespace(), o.GetName())
				}
			}
		}
	}
	return out
}

// pending reads what the bus holds for the parent: work items (and
// whether a replica holds them), desired states, schedules and DLQ
// entries.
func (b *Bus) pending(ctx context.Context, m *parentMatch) (Pending, error) {
	var out Pending
	ctrl, uid := m.ctrl.ID, string(m.parent.GetUID())
	keyed := m.plan.Keyed != nil
	// A keyed (MapController) parent's items have one subject per key,
	// <uid>~<key>, which no wildcard selects alone: read the controller's
	// and keep the parent's.
	filter := func(root string) string {
		if keyed {
			return root + ".*.*." + ctrl + ".*"
		}
		return root + ".*.*." + ctrl + "." + uid
	}
	mine := func(subject string) (string, bool) {
		_, _, puid, key, err := bus.ParseStoredSubjectKey(subject)
		return key, err == nil && puid == uid
	}
	n, infos, err := partitionConsumers(ctx, b.JS, bus.WorkStream, bus.WorkConsumerPrefix)
	if err != nil {
		return out, err
	}
	work, _, err := scan(ctx, b.JS, bus.WorkStream, filter("mc.work"), 0, 5000)
	if err != nil {
		return out, err
	}
	for _, msg := range work {
		key, ok := mine(msg.Subject)
		if !ok {
			continue
		}
		var item bus.WorkItem
		_ = json.Unmarshal(msg.Data, &item)
		pi := PendingItem{Seq: msg.Seq, Time: msg.Time, MapKey: key, Reason: item.Reason, Attempt: item.Attempt}
		if slot, _, _, err := bus.ParseStoredSubject(msg.Subject); err == nil && n > 0 {
			if ci := infos[bus.PartitionOf(slot, n)]; ci != nil && msg.Seq <= ci.Delivered.Stream {
				pi.InFlight = true
			}
		}
		out.Work = append(out.Work, pi)
	}
	desired, _, err := scan(ctx, b.JS, bus.DesiredStream, filter("mc.desired"), 0, 5000)
	if err != nil {
		return out, err
	}
	for _, msg := range desired {
		key, ok := mine(msg.Subject)
		if !ok {
			continue
		}
		var ds struct {
			Hook    string `json:"hook"`
			Attempt int    `json:"attempt"`
		}
		_ = json.Unmarshal(msg.Data, &ds)
		out.Desired = append(out.Desired, PendingItem{Seq: msg.Seq, Time: msg.Time, MapKey: key, Reason: ds.Hook, Attempt: ds.Attempt})
	}
	schedFilter := "mc.sched." + ctrl + "." + uid
	if keyed {
		schedFilter = "mc.sched." + ctrl + ".*"
	}
	sched, _, err := scan(ctx, b.JS, bus.SchedStream, schedFilter, 0, 5000)
	if err != nil {
		return out, err
	}
	for _, msg := range sched {
		_, token, err := bus.ParseKeySubject(msg.Subject)
		puid, key := bus.SplitParentToken(token)
		if err != nil || puid != uid {
			continue
		}
		var item bus.WorkItem
		_ = json.Unmarshal(msg.Data, &item)
		pi := PendingItem{Seq: msg.Seq, Time: msg.Time, MapKey: key, Reason: item.Reason, Attempt: item.Attempt}
		if v := msg.Header["Nats-Schedule"]; len(v) > 0 {
			pi.At = strings.TrimPrefix(v[0], "@at ")
		}
		out.Schedule = append(out.Schedule, pi)
	}
	dlq, _, err := scan(ctx, b.JS, bus.DLQStream, "mc.dlq.*."+ctrl+".*", 0, 5000)
	if err != nil {
		return out, err
	}
	for _, msg := range dlq {
		parts := strings.Split(msg.Subject, ".")
		if puid, _ := bus.SplitParentToken(parts[len(parts)-1]); puid != uid {
			continue
		}
		e := dlqEntry(msg)
		e.Body = nil
		out.DLQ = append(out.DLQ, e)
	}
	return out, nil
}

// eventGVR is core v1 Events, listed through the dynamic client (see
// leaseGVR).
var eventGVR = schema.GroupVersionResource{Version: "v1", Resource: "events"}

// events lists the parent's Events, newest last.
func (b *Bus) events(ctx context.Context, p *unstructured.Unstructured) ([]EventInfo, error) {
	sel := fields.Set{"involvedObject.uid": string(p.GetUID())}.AsSelector().String()
	l, err := b.Dyn.Resource(eventGVR).Namespace(p.GetNamespace()).List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		return nil, fmt.Errorf("list events of %s: %w", p.GetName(), err)
	}
	var out []EventInfo
	for _, u := range l.Items {
		var e corev1.Event
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &e); err != nil {
			return nil, fmt.Errorf("read event %s of %s: %w", u.GetName(), p.GetName(), err)
		}
		out = append(out, eventInfo(e))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Last.Before(out[j].Last) })
	return out, nil
}

func eventInfo(e corev1.Event) EventInfo {
	last := e.LastTimestamp.Time
	if last.IsZero() {
		last = e.EventTime.Time
	}
	if last.IsZero() {
		last = e.CreationTimestamp.Time
	}
	count := e.Count
	if e.Series != nil && e.Series.Count > count {
		count = e.Series.Count
	}
	src := e.Source.Component
	if src == "" {
		src = e.ReportingController
	}
	return EventInfo{Type: e.Type, Reason: e.Reason, Message: e.Message, Count: max(count, 1), Last: last, Source: src}
}

// WriteExplanation prints an explanation as kubectl describe does.
func WriteExplanation(w io.Writer, ex *Explanation) error {
	p := ex.Parent
	fmt.Fprintf(w, "Parent:       %s %s (%s)\n", p.Kind, parentLabel(p.Namespace, p.Name), p.APIVersion)
	fmt.Fprintf(w, "UID:          %s\n", p.UID)
	gen := fmt.Sprintf("%d", p.Generation)
	if p.ObservedGeneration != nil {
		gen += fmt.Sprintf(" (observed %d)", *p.ObservedGeneration)
	}
	fmt.Fprintf(w, "Generation:   %s, resourceVersion %s\n", gen, p.ResourceVersion)
	if len(p.Finalizers) > 0 {
		fmt.Fprintf(w, "Finalizers:   %s\n", strings.Join(p.Finalizers, ", "))
	}
	if p.Deleting != nil {
		fmt.Fprintf(w, "Deleting:     since %s ago\n", Age(ex.Time.Sub(*p.Deleting)))
	}
	fmt.Fprintf(w, "Controller:   %s\n", ex.Controller)

	fmt.Fprintln(w, "\nLast syncs (dispatchers):")
	if len(ex.Syncs) == 0 {
		fmt.Fprintln(w, "  none recorded")
	}
	for _, r := range ex.Syncs {
		key := ""
		if r.MapKey != "" {
			key = " key " + r.MapKey
		}
		fmt.Fprintf(w, "  %s ago%s: work item %d (%s", Age(ex.Time.Sub(r.Started)), key, r.WorkSeq, r.Reason)
		if r.Attempt > 0 {
			fmt.Fprintf(w, ", attempt %d", r.Attempt)
		}
		fmt.Fprintf(w, ") -> %s in %s on %s\n", r.Result, seconds(r.Seconds), r.Member)
		for _, h := range r.Hooks {
			fmt.Fprintf(w, "    %s hook: %s", h.Hook, seconds(h.Seconds))
			if h.Error != "" {
				fmt.Fprintf(w, ", failed: %s", truncate(h.Error, 300))
			}
			fmt.Fprintln(w)
		}
		if a := r.Answer; a != nil {
			var kids []string
			for _, c := range a.Children {
				kids = append(kids, c.Kind+" "+parentLabel(c.Namespace, c.Name))
			}
			fmt.Fprintf(w, "    answer (%s): %d children", a.Hook, len(a.Children))
			if len(kids) > 0 {
				fmt.Fprintf(w, ": %s", truncate(strings.Join(kids, ", "), 300))
			}
			fmt.Fprintln(w)
			if a.Status != nil {
				data, _ := json.Marshal(a.Status)
				fmt.Fprintf(w, "    status: %s\n", truncate(string(data), 300))
			}
			if a.ResyncAfterSeconds > 0 {
				fmt.Fprintf(w, "    resyncAfterSeconds: %g\n", a.ResyncAfterSeconds)
			}
			if a.Finalized {
				fmt.Fprintln(w, "    finalized: true")
			}
		}
		if r.Error != "" {
			fmt.Fprintf(w, "    error: %s\n", truncate(r.Error, 300))
		}
	}
	fmt.Fprintln(w, "\nLast applies (appliers):")
	if len(ex.Applies) == 0 {
		fmt.Fprintln(w, "  none recorded")
	}
	for _, r := range ex.Applies {
		fmt.Fprintf(w, "  %s ago: desired state of work item %d (%s) -> %s in %s, %d writes, on %s\n",
			Age(ex.Time.Sub(r.Started)), r.WorkSeq, r.Reason, r.Result, seconds(r.Seconds), len(r.Writes), r.Member)
		if r.Error != "" {
			fmt.Fprintf(w, "    error: %s\n", truncate(r.Error, 300))
		}
	}
	for _, wr := range ex.Writes {
		from := "created"
		if wr.From != "" {
			from = "resourceVersion " + wr.From + " ->"
		}
		fmt.Fprintf(w, "    wrote %s: %s %s\n", wr.Object, from, wr.To)
	}
	fmt.Fprintln(w, "\nPending on the bus:")
	pd := ex.Pending
	if len(pd.Work)+len(pd.Desired)+len(pd.Schedule)+len(pd.DLQ) == 0 {
		fmt.Fprintln(w, "  nothing")
	}
	for _, it := range pd.Work {
		state := "waiting"
		if it.InFlight {
			state = "in flight"
		}
		fmt.Fprintf(w, "  work item %d (%s%s), %s for %s\n", it.Seq, it.Reason, attempt(it.Attempt), state, Age(ex.Time.Sub(it.Time)))
	}
	for _, it := range pd.Desired {
		fmt.Fprintf(w, "  desired state %d (%s), waiting for %s\n", it.Seq, it.Reason, Age(ex.Time.Sub(it.Time)))
	}
	for _, it := range pd.Schedule {
		fmt.Fprintf(w, "  schedule: %s%s at %s\n", it.Reason, attempt(it.Attempt), it.At)
	}
	for _, e := range pd.DLQ {
		fmt.Fprintf(w, "  DLQ entry %d (%s stage, %d deliveries, %s ago): metabus dlq replay %d\n", e.Seq, e.Stage, e.Deliveries, Age(ex.Time.Sub(e.Time)), e.Seq)
	}
	fmt.Fprintln(w, "\nEvents:")
	if len(ex.Events) == 0 {
		fmt.Fprintln(w, "  none")
	} else {
		t := newTable(w, "  LAST", "TYPE", "REASON", "COUNT", "FROM", "MESSAGE")
		for _, e := range ex.Events {
			t.row("  "+Age(ex.Time.Sub(e.Last)), e.Type, e.Reason, fmt.Sprint(e.Count), dash(e.Source), truncate(e.Message, 200))
		}
		if err := t.flush(); err != nil {
			return err
		}
	}
	for _, n := range ex.Notes {
		fmt.Fprintln(w, "note:", n)
	}
	return nil
}

func attempt(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(", attempt %d", n)
}
