package jsbus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/pkg/bus"
)

// errCodeMaxMsgsPerSubject is JetStream's "maximum messages per subject
// exceeded". On MC_WORK it means the parent already has an item pending
// behind the one in flight, and that pending item will read fresh state:
// the publish is covered, not lost.
const errCodeMaxMsgsPerSubject jetstream.ErrorCode = 10077

// IsAlreadyQueued reports whether a publish to MC_WORK was refused because the
// parent is already queued.
func IsAlreadyQueued(err error) bool {
	var jsErr jetstream.JetStreamError
	if errors.As(err, &jsErr) && jsErr.APIError() != nil {
		return jsErr.APIError().ErrorCode == errCodeMaxMsgsPerSubject
	}
	return false
}

// Publisher publishes work items, desired states and schedules.
type Publisher struct {
	JS jetstream.JetStream
	// Queued (optional) is called for every work item PublishWork stored
	// (not for one refused because its parent was already queued): the
	// work-queue adds metric.
	Queued func(bus.WorkItem)
}

// PublishWork enqueues a work item. queued is false when the parent was
// already queued (error 10077), which is success.
func (p Publisher) PublishWork(ctx context.Context, item bus.WorkItem) (queued bool, err error) {
	if err := LeaseValid(ctx); err != nil {
		return false, err // a handler whose partition moved on: the new owner publishes
	}
	token, err := bus.CheckedParentToken(item.Parent.UID, item.MapKey)
	if err != nil {
		return false, fmt.Errorf("publish work item for %s: %w", item.Controller.ID(), err)
	}
	subject, err := bus.WorkSubject(item.Controller.ID(), token)
	if err != nil {
		return false, err
	}
	if item.EnqueuedAt.IsZero() {
		item.EnqueuedAt = time.Now()
	}
	msg, err := NewMsg(ctx, subject, bus.TypeSyncRequested, "", item.Controller, item.Parent, item,
		bus.WithItemKey(map[string]string{bus.ExtReason: item.Reason}, item.MapKey, item.Key()))
	if err != nil {
		return false, err
	}
	if _, err := p.JS.PublishMsg(ctx, msg); err != nil {
		if IsAlreadyQueued(err) {
			return false, nil
		}
		return false, fmt.Errorf("publish work item for %s/%s: %w", item.Controller.ID(), token, err)
	}
	p.queued(item)
	return true, nil
}

// PublishDesired publishes a desired state. Call it before acking the work
// item that produced it.
func (p Publisher) PublishDesired(ctx context.Context, ds bus.DesiredState) error {
	if err := LeaseValid(ctx); err != nil {
		return err // a handler whose partition moved on: the new owner publishes
	}
	token, err := bus.CheckedParentToken(ds.Parent.UID, ds.MapKey)
	if err != nil {
		return fmt.Errorf("publish desired state for %s: %w", ds.Controller.ID(), err)
	}
	subject, err := bus.DesiredSubject(ds.Controller.ID(), token)
	if err != nil {
		return err
	}
	// The work item's sequence alone names the desired state: each keyed
	// item is its own MC_WORK message with its own sequence.
	id := bus.DesiredMsgID(ds.Parent.UID, ds.WorkSeq)
	msg, err := NewMsg(ctx, subject, bus.TypeDesired, id, ds.Controller, ds.Parent, ds,
		bus.WithItemKey(map[string]string{bus.ExtWorkSeq: bus.WorkSeqString(ds.WorkSeq)}, ds.MapKey, ds.Key()))
	if err != nil {
		return err
	}
	if _, err := p.JS.PublishMsg(ctx, msg, jetstream.WithMsgID(bus.DesiredDedupID(id, msg.Data))); err != nil {
		return fmt.Errorf("publish desired state for %s/%s: %w", ds.Controller.ID(), token, err)
	}
	return nil
}

// Schedule arranges for item to be enqueued at (or right after) at. A parent
// has one schedule (the server keeps one message per schedule subject), so
// the sooner deadline wins: a pending schedule that fires no later than at
// is kept, since the sync it causes re-arranges whatever else is needed (a
// hook asks for resyncAfterSeconds again, a failure schedules its retry).
// A later one is replaced. Schedules have second granularity; earlier
// deadlines fire as soon as the server sees them.
func (p Publisher) Schedule(ctx context.Context, item bus.WorkItem, at time.Time) error {
	if err := LeaseValid(ctx); err != nil {
		return err
	}
	ctrlID := item.Controller.ID()
	// A keyed item has its own schedule: a key's retry never replaces
	// another key's, nor the per-parent resync.
	token, err := bus.CheckedParentToken(item.Parent.UID, item.MapKey)
	if err != nil {
		return fmt.Errorf("schedule %s: %w", ctrlID, err)
	}
	subject, err := bus.SchedSubject(ctrlID, token)
	if err != nil {
		return err
	}
	target, err := bus.DueSubject(ctrlID, token)
	if err != nil {
		return err
	}
	msg, err := NewMsg(ctx, subject, bus.TypeSyncRequested, "", item.Controller, item.Parent, item,
		bus.WithItemKey(map[string]string{bus.ExtReason: item.Reason}, item.MapKey, item.Key()))
	if err != nil {
		return err
	}
	// Round up so a schedule never fires before it is due.
	at = at.Add(time.Second - 1).Truncate(time.Second)
	if pending, ok := p.scheduledAt(ctx, subject); ok && keepPending(pending, at, time.Now()) {
		return nil
	}
	if _, err := p.JS.PublishMsg(ctx, msg, jetstream.WithScheduleAt(at), jetstream.WithScheduleTarget(target)); err != nil {
		return fmt.Errorf("schedule %s/%s at %s: %w", ctrlID, token, at.Format(time.RFC3339), err)
	}
	return nil
}

// scheduleGrace is how long past its time a pending schedule may still be
// about to fire.
const scheduleGrace = 2 * time.Second

// keepPending reports whether a parent's pending schedule, firing at
// pending, makes a new one for at unnecessary: it fires no later, and it
// has not missed its time. A fault run found a schedule the server never
// fired, minutes past due; trusting it skipped every later retry of its
// parent, a finalizer stayed forever. A new schedule replaces it (one per
// subject).
func keepPending(pending, at, now time.Time) bool {
	return !pending.After(at) && now.Before(pending.Add(scheduleGrace))
}

// scheduledAt returns when the pending schedule on subject fires, if there
// is one (the server removes a one-shot schedule when it fires). Any error
// reads as "none": the new schedule is then published, as before.
func (p Publisher) scheduledAt(ctx context.Context, subject string) (time.Time, bool) {
	req, err := json.Marshal(map[string]string{"last_by_subj": subject})
	if err != nil {
		return time.Time{}, false
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	reply, err := p.JS.Conn().RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+bus.SchedStream, req)
	if err != nil {
		return time.Time{}, false
	}
	var resp struct {
		Message *struct {
			Header []byte `json:"hdrs"`
		} `json:"message"`
	}
	if err := json.Unmarshal(reply.Data, &resp); err != nil || resp.Message == nil {
		return time.Time{}, false
	}
	for _, line := range strings.Split(string(resp.Message.Header), "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || !strings.EqualFold(strings.TrimSpace(k), "Nats-Schedule") {
			continue
		}
		at, found := strings.CutPrefix(strings.TrimSpace(v), "@at ")
		if !found {
			return time.Time{}, false
		}
		t, err := time.Parse(time.RFC3339, at)
		return t, err == nil
	}
	return time.Time{}, false
}
