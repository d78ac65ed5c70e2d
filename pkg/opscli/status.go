package opscli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/discovery"
	"github.com/metabus/metabus/pkg/inspect"
	"github.com/metabus/metabus/pkg/natsx"
)

// Bus is the operator's view of metabus: its NATS connection and the
// cluster.
type Bus struct {
	NC  *nats.Conn
	JS  jetstream.JetStream
	Dyn dynamic.Interface
	// Disc resolves resources (the controllers' parents).
	Disc *discovery.Map
	// Timeout bounds how long replicas are waited for (inspect requests,
	// service pings); 0 is 2 s.
	Timeout time.Duration
	// Clock is the clock (time.Now if nil).
	Clock func() time.Time
}

// Now is the Bus's clock.
func (b *Bus) Now() time.Time { return b.now() }

func (b *Bus) now() time.Time {
	if b.Clock != nil {
		return b.Clock()
	}
	return time.Now()
}

func (b *Bus) timeout() time.Duration {
	if b.Timeout > 0 {
		return b.Timeout
	}
	return 2 * time.Second
}

// StatusOptions select what status reports.
type StatusOptions struct {
	// Controller ("<kind>/<name>" or a name) limits the report to it.
	Controller string
	// Window is how far back hook calls, applies and errors are counted
	// (at most bus.ActivityMinutes; 0 is 5 minutes).
	Window time.Duration
	// ScanLimit bounds the work items read per controller to tell waiting
	// from in-flight items (0: 1000).
	ScanLimit int
	// LeaderNamespace and LeaderName name the watcher's leader-election
	// Lease (the watcher's --leader-election-namespace and -id).
	LeaderNamespace, LeaderName string
}

// Status is metabus's state as the bus and the cluster hold it.
type Status struct {
	Time          time.Time          `json:"time"`
	WindowSeconds float64            `json:"windowSeconds"`
	Stages        []StageStatus      `json:"stages"`
	Controllers   []ControllerStatus `json:"controllers"`
	// NATS is the server this command is connected to.
	NATS *NATSServer `json:"nats,omitempty"`
	// Notes say what could not be known (replicas that did not answer,
	// scans cut short).
	Notes []string `json:"notes,omitempty"`
}

// NATSServer is a NATS server's release and whether it can reset consumers,
// which every graceful partition handover does.
type NATSServer struct {
	Name    string `json:"name,omitempty"`
	Version string `json:"version"`
	// ConsumerReset: the server is natsx.MinResetVersion or later. If not,
	// every handover waits for the reset to time out and what the
	// previous owner held is redelivered after AckWait.
	ConsumerReset  bool   `json:"consumerReset"`
	MinimumVersion string `json:"minimumVersion"`
	// Error says why the version could not be judged.
	Error string `json:"error,omitempty"`
}

// natsServerStatus judges the version a server announced.
func natsServerStatus(version, name string) *NATSServer {
	s := &NATSServer{Name: name, Version: version, MinimumVersion: natsx.MinResetVersion}
	ok, err := natsx.ConsumerResetSupported(version)
	s.ConsumerReset = ok
	if err != nil {
		s.Error = err.Error()
	}
	return s
}

// line is the server's line of the table output.
func (s *NATSServer) line() string {
	server := s.Version
	if s.Name != "" {
		server += " (" + s.Name + ")"
	}
	switch {
	case s.ConsumerReset:
		return fmt.Sprintf("NATS server %s: consumer reset supported (%s or later)", server, s.MinimumVersion)
	case s.Error != "":
		return fmt.Sprintf("NATS server %s: consumer reset unknown (%s): handovers may wait and redeliver after AckWait", server, s.Error)
	}
	return fmt.Sprintf("NATS server %s: consumer reset NOT supported (needs %s or later): every partition handover waits for the reset to time out "+
		"and redelivers after AckWait; upgrade NATS (%s is the tested release)", server, s.MinimumVersion, natsx.ServerImage)
}

// StageStatus is one stage: its replicas, and for the partitioned stages
// (dispatcher: MC_WORK, applier: MC_DESIRED) the partitions and their
// consumers' state.
type StageStatus struct {
	Stage    string `json:"stage"`
	Replicas int    `json:"replicas"`
	// Leader is the watcher's leader-election holder ("" without leader
	// election).
	Leader     string         `json:"leader,omitempty"`
	Partitions int            `json:"partitions,omitempty"`
	Unowned    int            `json:"unownedPartitions,omitempty"`
	Members    []MemberStatus `json:"members,omitempty"`
	// Waiting are messages not yet delivered to a replica, InFlight
	// delivered and not yet acknowledged (running, or queued in the
	// replica behind an earlier item of the same parent), Redelivered
	// in flight after more than one delivery.
	Waiting     uint64 `json:"waiting"`
	InFlight    uint64 `json:"inFlight"`
	Redelivered uint64 `json:"redelivered"`
}

// MemberStatus is one replica of a partitioned stage.
type MemberStatus struct {
	ID         string `json:"id"`
	Partitions int    `json:"partitions"`
	// Answered says whether it answered the inspect request: its
	// activity is counted only then.
	Answered bool `json:"answered"`
	// Since is when it started recording (its start).
	Since *time.Time `json:"since,omitempty"`
}

// ControllerStatus is one controller.
type ControllerStatus struct {
	Controller string `json:"controller"`
	Kind       string `json:"kind"`
	Name       string `json:"name"`
	ID         string `json:"id"`
	// Work items in MC_WORK: waiting for a replica, in flight, and the
	// oldest one's enqueue time. Retrying counts items of parents whose
	// last sync failed (attempt > 0). Partial: the scan stopped at its
	// limit, so Waiting, InFlight and Retrying are lower bounds (Queued,
	// the total, is exact).
	Queued   int        `json:"queued"`
	Waiting  int        `json:"waiting"`
	InFlight int        `json:"inFlight"`
	Retrying int        `json:"retrying"`
	Oldest   *time.Time `json:"oldest,omitempty"`
	Partial  bool       `json:"partial,omitempty"`
	// Desired states in MC_DESIRED not yet applied, schedules pending in
	// MC_SCHED (retries and resyncs), entries in MC_DLQ.
	Desired   int `json:"desired"`
	Scheduled int `json:"scheduled"`
	DLQ       int `json:"dlq"`
	// In the window, as recorded by the replicas that answered.
	HookCalls   int           `json:"hookCalls"`
	HookErrors  int           `json:"hookErrors"`
	Applies     int           `json:"applies"`
	ApplyErrors int           `json:"applyErrors"`
	LastError   *ErrorSummary `json:"lastError,omitempty"`
}

// ErrorSummary is a failed sync or apply.
type ErrorSummary struct {
	Time    time.Time `json:"time"`
	Stage   string    `json:"stage"`
	Parent  string    `json:"parent"`
	MapKey  string    `json:"mapKey,omitempty"`
	Message string    `json:"message"`
}

// statusInput is everything status reads, for summarize.
type statusInput struct {
	now         time.Time
	window      time.Duration
	controllers []controllerObj
	owners      map[string]*ownership
	partitions  map[string]partitionState // by stage
	work        map[string]uint64         // MC_WORK subject counts
	desired     map[string]uint64
	sched       map[string]uint64
	dlq         map[string]uint64
	scans       map[string]workScan // by controller ID
	replies     []bus.InspectReply
	leader      string
	watchers    int // snapshot service instances
	revisions   int // revisions service instances
	notes       []string
}

// partitionState is a partitioned stream's consumers.
type partitionState struct {
	n     int
	infos map[int]*jetstream.ConsumerInfo
}

// workScan is what reading a controller's work items found.
type workScan struct {
	waiting, inFlight, retrying int
	oldest                      time.Time
	partial                     bool
}

// stageOfService maps the partitioned stages to their services.
var stageOfService = map[string]string{"dispatcher": bus.WorkStage, "applier": bus.DesiredStage}

// GetStatus reads the bus and the cluster.
func (b *Bus) GetStatus(ctx context.Context, o StatusOptions) (*Status, error) {
	in := statusInput{now: b.now(), window: o.Window}
	if in.window <= 0 {
		in.window = 5 * time.Minute
	}
	if in.window > bus.ActivityMinutes*time.Minute {
		in.window = bus.ActivityMinutes * time.Minute
	}
	limit := o.ScanLimit
	if limit <= 0 {
		limit = 1000
	}
	ctrls, err := listControllers(ctx, b.Dyn)
	if err != nil {
		return nil, err
	}
	if o.Controller != "" {
		kind, name, err := ParseControllerRef(o.Controller)
		if err != nil {
			return nil, err
		}
		if ctrls = matchControllers(ctrls, kind, name); len(ctrls) == 0 {
			return nil, NotFound("controller %s not found", o.Controller)
		}
	}
	in.controllers = ctrls
	if in.owners, err = readOwnership(ctx, b.JS); err != nil {
		return nil, err
	}
	in.partitions = map[string]partitionState{}
	for _, s := range []struct{ stage, stream, prefix string }{
		{bus.WorkStage, bus.WorkStream, bus.WorkConsumerPrefix},
		{bus.DesiredStage, bus.DesiredStream, bus.DesiredConsumerPrefix},
	} {
		n, infos, err := partitionConsumers(ctx, b.JS, s.stream, s.prefix)
		if err != nil {
			return nil, err
		}
		in.partitions[s.stage] = partitionState{n: n, infos: infos}
	}
	for _, c := range []struct {
		into           *map[string]uint64
		stream, filter string
	}{
		{&in.work, bus.WorkStream, "mc.work.>"},
		{&in.desired, bus.DesiredStream, "mc.desired.>"},
		{&in.sched, bus.SchedStream, "mc.sched.>"},
		{&in.dlq, bus.DLQStream, "mc.dlq.>"},
	} {
		if *c.into, err = subjectCounts(ctx, b.JS, c.stream, c.filter); err != nil {
			return nil, err
		}
	}
	in.scans = map[string]workScan{}
	queued := queuedByController(in.work)
	for _, c := range ctrls {
		if queued[c.ID] == 0 {
			continue
		}
		msgs, more, err := scan(ctx, b.JS, bus.WorkStream, "mc.work.*.*."+c.ID+".*", 0, limit)
		if err != nil {
			return nil, err
		}
		in.scans[c.ID] = scanWork(msgs, more, in.partitions[bus.WorkStage])
		if more {
			in.notes = append(in.notes, fmt.Sprintf("%s: read %d of %d work items (--scan-limit): waiting, in flight and retrying are lower bounds",
				controllerLabel(c.Kind, c.Name), len(msgs), queued[c.ID]))
		}
	}
	replies, notes, err := b.askReplicas(ctx, in.owners, bus.InspectRequest{})
	if err != nil {
		return nil, err
	}
	in.replies, in.notes = replies, append(in.notes, notes...)
	in.leader, err = b.leader(ctx, o.LeaderNamespace, o.LeaderName)
	if err != nil {
		return nil, err
	}
	if in.watchers, err = pingService(ctx, b.NC, bus.SnapshotServiceName, b.timeout()); err != nil {
		return nil, err
	}
	if in.revisions, err = pingService(ctx, b.NC, bus.RevisionsServiceName, b.timeout()); err != nil {
		return nil, err
	}
	st := summarize(in)
	if b.NC != nil {
		// The server this command reached; in a cluster, the services'
		// metabus_nats_consumer_reset_supported says it for theirs.
		st.NATS = natsServerStatus(b.NC.ConnectedServerVersion(), b.NC.ConnectedServerName())
	}
	return &st, nil
}

// askReplicas sends req to every dispatcher and applier replica (the live
// members of the lease bucket) and gathers their replies, with a note for
// each stage where some did not answer in time.
func (b *Bus) askReplicas(ctx context.Context, owners map[string]*ownership, req bus.InspectRequest) ([]bus.InspectReply, []string, error) {
	var (
		out   []bus.InspectReply
		notes []string
	)
	for _, service := range []string{"dispatcher", "applier"} {
		stage, want := stageOfService[service], 0
		if o := owners[stage]; o != nil {
			want = len(o.members)
		}
		replies, err := inspect.Gather(ctx, b.NC, stage, req, want, b.timeout())
		if err != nil {
			return nil, nil, err
		}
		if len(replies) < want {
			notes = append(notes, fmt.Sprintf("%d of %d %s replicas answered: what the others did is not shown", len(replies), want, service))
		}
		var oldest time.Time
		for _, r := range replies {
			if oldest.IsZero() || r.Since.Before(oldest) {
				oldest = r.Since
			}
		}
		if len(replies) > 0 && req.ParentUID != "" {
			notes = append(notes, fmt.Sprintf("%s records go back to %s (replicas keep them in memory since they started)",
				service, oldest.UTC().Format(time.RFC3339)))
		}
		out = append(out, replies...)
	}
	return out, notes, nil
}

// leader reads the watcher's leader-election Lease ("" when there is none:
// an all-in-one process or a single watcher without leader election).
func (b *Bus) leader(ctx context.Context, ns, name string) (string, error) {
	if b.Dyn == nil || name == "" {
		return "", nil
	}
	if ns == "" {
		ns = "metabus"
	}
	l, err := b.Dyn.Resource(leaseGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read leader-election Lease %s/%s: %w", ns, name, err)
	}
	holder, _, _ := unstructured.NestedString(l.Object, "spec", "holderIdentity")
	return holder, nil
}

// leaseGVR is coordination.k8s.io/v1 Leases, read through the dynamic
// client: a typed clientset would link and register every built-in API
// group in each binary (code pages and heap for nothing it uses).
var leaseGVR = schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}

// pingService counts the instances of a nats micro service that answer a
// ping in time.
func pingService(ctx context.Context, nc *nats.Conn, name string, timeout time.Duration) (int, error) {
	inbox := nc.NewRespInbox()
	ch := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return 0, fmt.Errorf("ping %s: %w", name, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest("$SRV.PING."+name, inbox, nil); err != nil {
		return 0, fmt.Errorf("ping %s: %w", name, err)
	}
	// Instances answer at once; a short quiet period after the last
	// answer ends the wait early.
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	n := 0
	for {
		quiet := time.NewTimer(min(timeout, 300*time.Millisecond))
		select {
		case m := <-ch:
			quiet.Stop()
			if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
				return n, nil // no responders
			}
			n++
		case <-quiet.C:
			return n, nil
		case <-deadline.C:
			quiet.Stop()
			return n, nil
		case <-ctx.Done():
			quiet.Stop()
			return n, ctx.Err()
		}
	}
}

// queuedByController sums stored-subject counts per controller ID.
func queuedByController(counts map[string]uint64) map[string]int {
	out := map[string]int{}
	for subj, n := range counts {
		ctrl := subjectController(subj)
		if ctrl != "" {
			out[ctrl] += int(n)
		}
	}
	return out
}

// subjectController is the controller ID of a stored subject of MC_WORK,
// MC_DESIRED (mc.<root>.<g>.<slot>.<ctrl>.<token>), MC_SCHED
// (mc.sched.<ctrl>.<token>, mc.due...) or MC_DLQ
// (mc.dlq.<stage>.<ctrl>.<token>): always the second-to-last token.
func subjectController(subj string) string {
	parts := strings.Split(subj, ".")
	if len(parts) < 4 {
		return ""
	}
	return parts[len(parts)-2]
}

// scanWork tells the waiting items from those in flight: a message of a
// work queue is in flight when its partition consumer has delivered past
// it (acknowledged messages are gone from a work queue).
func scanWork(msgs []storedMsg, partial bool, ps partitionState) workScan {
	var s workScan
	s.partial = partial
	for _, m := range msgs {
		slot, _, _, err := bus.ParseStoredSubject(m.Subject)
		delivered := uint64(0)
		if err == nil && ps.n > 0 {
			if ci := ps.infos[bus.PartitionOf(slot, ps.n)]; ci != nil {
				delivered = ci.Delivered.Stream
			}
		}
		if m.Seq <= delivered {
			s.inFlight++
		} else {
			s.waiting++
		}
		var item bus.WorkItem
		if json.Unmarshal(m.Data, &item) == nil && item.Attempt > 0 {
			s.retrying++
		}
		t := m.Time
		if !item.EnqueuedAt.IsZero() && item.EnqueuedAt.Before(t) {
			t = item.EnqueuedAt
		}
		if s.oldest.IsZero() || t.Before(s.oldest) {
			s.oldest = t
		}
	}
	return s
}

// summarize turns what status read into the report. It is pure.
func summarize(in statusInput) Status {
	st := Status{Time: in.now, WindowSeconds: in.window.Seconds(), Notes: in.notes}
	answered := map[string]bus.InspectReply{}
	for _, r := range in.replies {
		answered[r.Stage+"/"+r.Member] = r
	}
	st.Stages = append(st.Stages, StageStatus{Stage: "watcher", Replicas: in.watchers, Leader: in.leader})
	for _, service := range []string{"dispatcher", "applier"} {
		stage := stageOfService[service]
		ss := StageStatus{Stage: service}
		own := in.owners[stage]
		if own == nil {
			own = &ownership{leases: map[string]string{}}
		}
		ps := in.partitions[stage]
		ss.Partitions = ps.n
		held := map[string]int{}
		for p := range ps.n {
			holder := own.leases[bus.PartitionConsumerName("", ps.n, p)]
			if holder == "" {
				ss.Unowned++
				continue
			}
			held[holder]++
		}
		members := append([]string(nil), own.members...)
		for h := range held { // a holder whose member entry expired first
			if !contains(members, h) {
				members = append(members, h)
			}
		}
		sort.Strings(members)
		for _, m := range members {
			ms := MemberStatus{ID: m, Partitions: held[m]}
			if r, ok := answered[stage+"/"+m]; ok {
				ms.Answered = true
				since := r.Since
				ms.Since = &since
			}
			ss.Members = append(ss.Members, ms)
		}
		ss.Replicas = len(own.members)
		for _, ci := range ps.infos {
			ss.Waiting += ci.NumPending
			ss.InFlight += uint64(ci.NumAckPending)
			ss.Redelivered += uint64(ci.NumRedelivered)
		}
		st.Stages = append(st.Stages, ss)
	}
	st.Stages = append(st.Stages, StageStatus{Stage: "revisions", Replicas: in.revisions})

	queued := queuedByController(in.work)
	desired := queuedByController(in.desired)
	sched := queuedByController(in.sched)
	dlq := queuedByController(in.dlq)
	since := in.now.Add(-in.window)
	for _, c := range in.controllers {
		cs := ControllerStatus{
			Controller: controllerLabel(c.Kind, c.Name), Kind: c.Kind, Name: c.Name, ID: c.ID,
			Queued: queued[c.ID], Desired: desired[c.ID], Scheduled: sched[c.ID], DLQ: dlq[c.ID],
		}
		if s, ok := in.scans[c.ID]; ok {
			cs.Waiting, cs.InFlight, cs.Retrying, cs.Partial = s.waiting, s.inFlight, s.retrying, s.partial
			if !s.oldest.IsZero() {
				t := s.oldest
				cs.Oldest = &t
			}
		}
		for _, r := range in.replies {
			for _, a := range r.Controllers {
				if a.Controller != c.ID {
					continue
				}
				calls, errs := 0, 0
				for _, m := range a.Minutes {
					// A minute counts when any of it is in the window.
					if m.Start.Add(time.Minute).After(since) {
						calls += m.Calls
						errs += m.Errors
					}
				}
				if r.Stage == bus.WorkStage {
					cs.HookCalls += calls
					cs.HookErrors += errs
				} else {
					cs.Applies += calls
					cs.ApplyErrors += errs
				}
				if e := a.LastError; e != nil {
					at := e.Started.Add(time.Duration(e.Seconds * float64(time.Second)))
					if cs.LastError == nil || at.After(cs.LastError.Time) {
						cs.LastError = &ErrorSummary{Time: at, Stage: r.Stage, Parent: parentLabel(e.Parent.Namespace, e.Parent.Name), MapKey: e.MapKey, Message: e.Error}
					}
				}
			}
		}
		st.Controllers = append(st.Controllers, cs)
	}
	return st
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// WriteStatus prints a status as tables.
func WriteStatus(w io.Writer, st *Status) error {
	if st.NATS != nil {
		fmt.Fprintln(w, st.NATS.line())
		fmt.Fprintln(w)
	}
	t := newTable(w, "STAGE", "REPLICAS", "PARTITIONS", "UNOWNED", "WAITING", "IN-FLIGHT", "REDELIVERED", "LEADER")
	for _, s := range st.Stages {
		parts, unowned, waiting, inflight, redelivered := "-", "-", "-", "-", "-"
		if s.Partitions > 0 {
			parts, unowned = fmt.Sprint(s.Partitions), fmt.Sprint(s.Unowned)
			waiting, inflight, redelivered = fmt.Sprint(s.Waiting), fmt.Sprint(s.InFlight), fmt.Sprint(s.Redelivered)
		}
		t.row(s.Stage, fmt.Sprint(s.Replicas), parts, unowned, waiting, inflight, redelivered, dash(s.Leader))
	}
	if err := t.flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	t = newTable(w, "STAGE", "MEMBER", "PARTITIONS", "UP")
	for _, s := range st.Stages {
		for _, m := range s.Members {
			up := "no answer"
			if m.Since != nil {
				up = Age(st.Time.Sub(*m.Since))
			}
			t.row(s.Stage, m.ID, fmt.Sprint(m.Partitions), up)
		}
	}
	if err := t.flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	win := Age(time.Duration(st.WindowSeconds * float64(time.Second)))
	t = newTable(w, "CONTROLLER", "WAITING", "IN-FLIGHT", "OLDEST", "RETRYING", "DESIRED", "SCHEDULED", "DLQ",
		"HOOKS/"+win, "HOOK-ERRORS", "APPLIES", "APPLY-ERRORS", "LAST ERROR")
	for _, c := range st.Controllers {
		oldest := "-"
		if c.Oldest != nil {
			oldest = Age(st.Time.Sub(*c.Oldest))
		}
		waiting, inflight := fmt.Sprint(c.Waiting), fmt.Sprint(c.InFlight)
		if c.Partial {
			waiting, inflight = "≥"+waiting, "≥"+inflight
		}
		last := "-"
		if e := c.LastError; e != nil {
			last = fmt.Sprintf("%s ago %s: %s", Age(st.Time.Sub(e.Time)), e.Parent, truncate(e.Message, 80))
		}
		t.row(c.Controller, waiting, inflight, oldest, fmt.Sprint(c.Retrying), fmt.Sprint(c.Desired), fmt.Sprint(c.Scheduled),
			fmt.Sprint(c.DLQ), fmt.Sprint(c.HookCalls), fmt.Sprint(c.HookErrors), fmt.Sprint(c.Applies), fmt.Sprint(c.ApplyErrors), last)
	}
	if err := t.flush(); err != nil {
		return err
	}
	for _, n := range st.Notes {
		fmt.Fprintln(w, "note:", n)
	}
	return nil
}
