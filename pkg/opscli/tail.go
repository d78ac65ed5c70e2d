package opscli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	cejs "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/nats-io/nats.go"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/inspect"
)

// TailOptions select what tail follows.
type TailOptions struct {
	// Controller: "<kind>/<name>" (a bare name follows that name in every
	// kind).
	Controller string
	// Parent: "namespace/name" or "name".
	Parent string
	Format Format
}

// tailLine is one followed message, decoded.
type tailLine struct {
	time    time.Time
	what    string // WORK, SCHEDULE, DESIRED, SYNC, APPLY
	ctrl    bus.ControllerRef
	parent  bus.ObjectRef
	mapKey  string
	details string
}

// Tail follows work items, schedules and desired states as they are
// published, and the dispatchers' and appliers' records of each sync and
// apply, one line each, until ctx is done. It subscribes on core NATS:
// nothing is consumed, acknowledged or slowed down. Desired states are
// shown with their Secret children's values blanked.
func (b *Bus) Tail(ctx context.Context, o TailOptions, w io.Writer) error {
	ctrlTok := "*"
	var wantName, wantKind string
	if o.Controller != "" {
		kind, name, err := ParseControllerRef(o.Controller)
		if err != nil {
			return err
		}
		wantKind, wantName = kind, name
		if kind != "" {
			ctrlTok = bus.ControllerID(kind, name)
		}
	}
	var pns, pname string
	if o.Parent != "" {
		var err error
		if pns, pname, err = ParseObjectName(o.Parent); err != nil {
			return err
		}
	}
	msgs := make(chan *nats.Msg, 1024)
	var subs []*nats.Subscription
	defer func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
	}()
	for _, subj := range []string{
		"mc.work." + ctrlTok + ".*", "mc.sched." + ctrlTok + ".*", "mc.desired." + ctrlTok + ".*",
		bus.TraceFilter("", ctrlTok),
	} {
		s, err := b.NC.ChanSubscribe(subj, msgs)
		if err != nil {
			return fmt.Errorf("subscribe to %s: %w", subj, err)
		}
		subs = append(subs, s)
	}
	// The server has the subscriptions before the replicas are told to
	// publish (a command's context has no deadline, which
	// FlushWithContext wants).
	if err := b.NC.FlushTimeout(b.timeout()); err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	announced := make(chan error, 1)
	go func() { announced <- inspect.Announce(actx, b.NC) }()
	enc := json.NewEncoder(w)
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-announced:
			if err != nil {
				return err
			}
		case m := <-msgs:
			l, ok := decodeTail(m, b.now())
			if !ok {
				continue
			}
			if wantName != "" && (l.ctrl.Name != wantName || (wantKind != "" && l.ctrl.Kind != wantKind)) {
				continue
			}
			if o.Parent != "" && (l.parent.Namespace != pns || l.parent.Name != pname) {
				continue
			}
			if o.Format == JSON || o.Format == YAML {
				v, err := tailEvent(m)
				if err != nil {
					continue
				}
				if err := enc.Encode(v); err != nil {
					return err
				}
				continue
			}
			if _, err := fmt.Fprintln(w, formatTail(l)); err != nil {
				return err
			}
		}
	}
}

// tailEvent is what -o json prints for a message: a CloudEvent (work item,
// schedule, desired state) in its structured JSON form, Secret data blanked;
// a replica's record as it is.
func tailEvent(m *nats.Msg) (any, error) {
	if strings.HasPrefix(m.Subject, "mc.trace.") {
		return json.RawMessage(m.Data), nil
	}
	data := m.Data
	if strings.HasPrefix(m.Subject, "mc.desired.") {
		data, _ = bus.RedactSecrets(data)
	}
	ev, err := binding.ToEvent(context.Background(), cejs.NewMessage(&nats.Msg{Subject: m.Subject, Header: m.Header, Data: data}))
	if err != nil {
		return nil, err
	}
	return ev, nil
}

// decodeTail decodes a followed message. It is pure but for the clock,
// which stamps messages that carry no time.
func decodeTail(m *nats.Msg, now time.Time) (tailLine, bool) {
	l := tailLine{time: now}
	if t, err := time.Parse(time.RFC3339Nano, m.Header.Get("ce-time")); err == nil {
		l.time = t
	}
	switch {
	case strings.HasPrefix(m.Subject, "mc.trace."):
		var r bus.Record
		if json.Unmarshal(m.Data, &r) != nil {
			return l, false
		}
		l.ctrl, l.parent, l.mapKey = r.Controller, r.Parent, r.MapKey
		l.time = r.Started.Add(time.Duration(r.Seconds * float64(time.Second)))
		var d []string
		if r.Stage == bus.WorkStage {
			l.what = "SYNC"
			d = append(d, "result="+r.Result, fmt.Sprintf("seq=%d", r.WorkSeq))
			for _, h := range r.Hooks {
				s := fmt.Sprintf("hook=%s(%s)", h.Hook, seconds(h.Seconds))
				if h.Error != "" {
					s += " hook-error=" + quote(h.Error)
				}
				d = append(d, s)
			}
			if a := r.Answer; a != nil {
				d = append(d, fmt.Sprintf("children=%d", len(a.Children)))
				if a.Status != nil {
					d = append(d, "status=set")
				}
				if a.Finalized {
					d = append(d, "finalized=true")
				}
			}
		} else {
			l.what = "APPLY"
			d = append(d, "result="+r.Result, "hook="+r.Reason, fmt.Sprintf("seq=%d", r.WorkSeq), fmt.Sprintf("writes=%d", len(r.Writes)))
		}
		d = append(d, "took="+seconds(r.Seconds))
		if r.Error != "" {
			d = append(d, "error="+quote(r.Error))
		}
		l.details = strings.Join(d, " ")
	case strings.HasPrefix(m.Subject, "mc.desired."):
		var ds bus.DesiredState
		if json.Unmarshal(m.Data, &ds) != nil {
			return l, false
		}
		l.what, l.ctrl, l.parent, l.mapKey = "DESIRED", ds.Controller, ds.Parent, ds.MapKey
		d := []string{"hook=" + ds.Hook, fmt.Sprintf("seq=%d", ds.WorkSeq), fmt.Sprintf("children=%d", len(ds.Children))}
		if ds.Status != nil {
			d = append(d, "status=set")
		}
		if ds.ResyncAfterSeconds > 0 {
			d = append(d, fmt.Sprintf("resyncAfter=%gs", ds.ResyncAfterSeconds))
		}
		if ds.Finalized {
			d = append(d, "finalized=true")
		}
		l.details = strings.Join(d, " ")
	case strings.HasPrefix(m.Subject, "mc.work."), strings.HasPrefix(m.Subject, "mc.sched."):
		var item bus.WorkItem
		if json.Unmarshal(m.Data, &item) != nil {
			return l, false
		}
		l.what, l.ctrl, l.parent, l.mapKey = "WORK", item.Controller, item.Parent, item.MapKey
		d := []string{"reason=" + item.Reason}
		if item.Attempt > 0 {
			d = append(d, fmt.Sprintf("attempt=%d", item.Attempt))
		}
		if strings.HasPrefix(m.Subject, "mc.sched.") {
			l.what = "SCHEDULE"
			if at, ok := strings.CutPrefix(m.Header.Get("Nats-Schedule"), "@at "); ok {
				d = append(d, "at="+at)
			}
		}
		l.details = strings.Join(d, " ")
	default:
		return l, false
	}
	return l, true
}

// formatTail is one human line.
func formatTail(l tailLine) string {
	parent := parentLabel(l.parent.Namespace, l.parent.Name)
	if l.mapKey != "" {
		parent += "~" + l.mapKey
	}
	return fmt.Sprintf("%s %-8s %s %s %s", l.time.Local().Format("15:04:05.000"), l.what,
		controllerLabel(l.ctrl.Kind, l.ctrl.Name), parent, l.details)
}

func seconds(s float64) string {
	return (time.Duration(s * float64(time.Second))).Round(100 * time.Microsecond).String()
}

func quote(s string) string { return fmt.Sprintf("%q", truncate(s, 200)) }
