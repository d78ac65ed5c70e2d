package applier

import (
	"context"
	"errors"
	"flag"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/bus"
)

// RegisterFlags adds the applier's own flags; shared ones (--workers,
// --snapshot-wait, --events-qps...) live in pkg/cli.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.BoolVar(&c.BusEvents, "bus-events", false, "publish a desired-state and an applied CloudEvent per desired state on "+
		bus.EventsRoot+".> (stream "+bus.EventsStream+", Secret data removed) for other systems to consume; "+
		"it costs a publish and a redaction per desired state")
	fs.DurationVar(&c.BusEventsMaxAge, "bus-events-max-age", bus.DefaultEventsMaxAge, "how long "+bus.EventsStream+" keeps an event (with --bus-events)")
	fs.Int64Var(&c.BusEventsMaxBytes, "bus-events-max-bytes", bus.DefaultEventsMaxBytes, "the size "+bus.EventsStream+
		" keeps, the oldest events going first (with --bus-events)")
	fs.IntVar(&c.BusEventsReplicas, "bus-events-replicas", 1, "replicas of "+bus.EventsStream+" (with --bus-events; as the watcher's --stream-replicas in a NATS cluster)")
	c.registerIdentityFlags(fs)
}

// changeOp is what a write did to a child, for the applied event.
type changeOp int

const (
	changeCreated changeOp = iota
	changeUpdated
	changeDeleted
)

// noteChange lists a child write in the apply's write log when events are
// published (the log's changes is set): obj names the child, uid and rv
// are what the write produced ("" if unknown).
func noteChange(ctx context.Context, op changeOp, obj *unstructured.Unstructured, uid, rv string) {
	wl, _ := ctx.Value(writeLogKey{}).(*writeLog)
	if wl == nil || wl.changes == nil || obj == nil {
		return
	}
	c := bus.ChildChange{APIVersion: obj.GetAPIVersion(), Kind: obj.GetKind(), Namespace: obj.GetNamespace(), Name: obj.GetName(),
		UID: uid, ResourceVersion: rv}
	if c.UID == "" {
		c.UID = string(obj.GetUID())
	}
	switch op {
	case changeCreated:
		wl.changes.Created = append(wl.changes.Created, c)
	case changeUpdated:
		wl.changes.Updated = append(wl.changes.Updated, c)
	case changeDeleted:
		wl.changes.Deleted = append(wl.changes.Deleted, c)
	}
}

// noteStatusWritten records in the write log that the parent was written.
func noteStatusWritten(ctx context.Context) {
	if wl, _ := ctx.Value(writeLogKey{}).(*writeLog); wl != nil && wl.changes != nil {
		wl.changes.StatusWritten = true
	}
}

// eventOutcome maps an apply's result (the metrics label) and error to the
// applied event's outcome and reason.
func eventOutcome(result string, err error) (string, string) {
	switch result {
	case resultOK:
		return bus.OutcomeApplied, ""
	case resultNoop:
		return bus.OutcomeUnchanged, ""
	case resultConflict:
		return bus.OutcomeConflict, "conflict"
	case resultError:
		var failed *applyError
		if errors.As(err, &failed) && failed.reason != "" {
			return bus.OutcomeFailed, failed.reason
		}
		if len(denials(err)) > 0 {
			return bus.OutcomeFailed, "ApplyForbidden"
		}
		return bus.OutcomeFailed, "error"
	case resultFinalized:
		return bus.OutcomeFinalized, ""
	case resultReleased:
		return bus.OutcomeReleased, ""
	}
	return bus.OutcomeSkipped, result
}

// publishEvents publishes ds and what became of it on the consumer-facing
// subjects (--bus-events). A core publish each: at most once, as
// docs/events.md says, and a lost one costs nothing but the event.
func (a *Applier) publishEvents(ds *bus.DesiredState, wl *writeLog, result string, err error) {
	if !a.cfg.BusEvents || a.nc == nil || result == resultCancelled {
		return
	}
	ev := &bus.AppliedEvent{}
	if wl != nil && wl.changes != nil {
		ev = wl.changes
	}
	ev.Controller, ev.Parent, ev.MapKey, ev.WorkSeq, ev.Hook = ds.Controller, ds.Parent, ds.MapKey, ds.WorkSeq, ds.Hook
	ev.Outcome, ev.Reason = eventOutcome(result, err)
	if err != nil && (ev.Outcome == bus.OutcomeFailed || ev.Outcome == bus.OutcomeConflict) {
		ev.Message = err.Error()
	}
	ev.ProducedAt, ev.AppliedAt = ds.ProducedAt, time.Now().UTC()
	desired, derr := bus.NewDesiredEvent(ds)
	applied, aerr := bus.NewAppliedEvent(ev)
	for _, e := range []struct {
		ev  *bus.Event
		err error
	}{{desired, derr}, {applied, aerr}} {
		if e.err != nil {
			a.log.Warn("cannot encode a bus event", zap.String("controller", ds.Controller.Name),
				zap.String("parent", ds.Parent.Namespace+"/"+ds.Parent.Name), zap.Error(e.err))
			continue
		}
		if perr := a.nc.PublishMsg(&nats.Msg{Subject: e.ev.Subject, Header: nats.Header(e.ev.Header), Data: e.ev.Data}); perr != nil {
			a.log.Debug("publish bus event", zap.String("subject", e.ev.Subject), zap.Error(perr))
		}
	}
}
