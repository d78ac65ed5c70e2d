// Package echo recognises metabus's own writes when they come back as watch
// events, so that they do not cost another hook call.
//
// An applier that applied a desired state completely broadcasts a
// bus.Applied note: the resourceVersion of every object the hook was shown
// and the resourceVersion each of its own updates produced. Two decisions
// follow, both per controller (a write of one controller is news to another):
//
//   - an update event whose new resourceVersion is one this controller's
//     applier wrote is an echo: the watcher does not enqueue it (Book.Wrote);
//   - a sync whose hook would be shown exactly what it was last shown, except
//     objects that are now at a resourceVersion the applier wrote from that
//     very answer, is an echo: the dispatcher skips the hook (Book.Echo, whose
//     core is the pure IsEcho).
//
// What is never an echo: a create or a delete (the set of objects changes,
// e.g. a child the hook asked for now exists and should be counted), and any
// change by anyone else, since its resourceVersion is not one metabus wrote.
// Notes travel on core NATS without persistence: a lost or late note only
// costs the hook call it would have saved.
package echo

import (
	"encoding/json"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/snapshot"
)

// DefaultSize bounds how many parents (and, separately, written objects) a
// Book remembers in each of its two generations.
const DefaultSize = 50000

// IsEcho reports whether a hook about to be shown now (UID to
// resourceVersion of every object in the request) would see only what it
// was shown for last, plus the applier's own updates made from its answer.
func IsEcho(last *bus.Applied, now map[string]string) bool {
	if last == nil || len(last.Inputs) == 0 || len(now) != len(last.Inputs) {
		return false
	}
	for uid, rv := range now {
		seen, ok := last.Inputs[uid]
		if !ok {
			return false
		}
		if rv != seen && (rv == "" || last.Wrote[uid] != rv) {
			return false
		}
	}
	return true
}

// Inputs lists the objects of a snapshot that a hook request is built from:
// the controller, the parent, the children and the related objects, by UID.
// It returns nil, which is never an echo, when the snapshot asks for
// ownership changes (adoptions or releases are news to the hook).
func Inputs(snap *snapshot.Response) map[string]string {
	if snap == nil || snap.Parent == nil || snap.Controller == nil {
		return nil
	}
	in := map[string]string{
		string(snap.Controller.GetUID()): snap.Controller.GetResourceVersion(),
		string(snap.Parent.GetUID()):     snap.Parent.GetResourceVersion(),
	}
	for _, groups := range [][]snapshot.Group{snap.Children, snap.Related} {
		for _, g := range groups {
			if len(g.Adopt) > 0 || len(g.Release) > 0 {
				return nil
			}
			for _, o := range g.Objects {
				in[string(o.GetUID())] = o.GetResourceVersion()
			}
		}
	}
	return in
}

// Book remembers the latest Applied note per parent and the writes they
// list, in two generations of bounded maps: when the current one is full it
// becomes the old one and the oldest is dropped. Forgetting only costs a
// hook call. The zero value is not usable; call NewBook.
type Book struct {
	size int

	mu         sync.Mutex
	notes, old map[string]*bus.Applied // by controller ID / parent UID
	wrote, wo  map[string]string       // by controller ID / object UID
}

// NewBook returns a Book holding up to size entries per generation
// (DefaultSize if size <= 0).
func NewBook(size int) *Book {
	if size <= 0 {
		size = DefaultSize
	}
	return &Book{size: size, notes: map[string]*bus.Applied{}, old: map[string]*bus.Applied{},
		wrote: map[string]string{}, wo: map[string]string{}}
}

// Record takes a note in. A note older (by work sequence) than the one the
// Book holds for the same parent is ignored.
func (b *Book) Record(a *bus.Applied) {
	if a == nil || a.ParentUID == "" {
		return
	}
	ctrl := a.Controller.ID()
	key := ctrl + "/" + a.ParentUID
	b.mu.Lock()
	defer b.mu.Unlock()
	if cur := b.noteLocked(key); cur != nil && cur.WorkSeq > a.WorkSeq {
		return
	}
	if len(b.notes) >= b.size {
		b.old, b.notes = b.notes, make(map[string]*bus.Applied, len(b.notes))
	}
	b.notes[key] = a
	delete(b.old, key)
	for uid, rv := range a.Wrote {
		if len(b.wrote) >= b.size {
			b.wo, b.wrote = b.wrote, make(map[string]string, len(b.wrote))
		}
		b.wrote[ctrl+"/"+uid] = rv
	}
}

func (b *Book) noteLocked(key string) *bus.Applied {
	if n, ok := b.notes[key]; ok {
		return n
	}
	return b.old[key]
}

// Wrote reports whether rv is the resourceVersion the controller's own
// latest update of object uid produced.
func (b *Book) Wrote(ctrlID, uid, rv string) bool {
	if b == nil || rv == "" {
		return false
	}
	key := ctrlID + "/" + uid
	b.mu.Lock()
	defer b.mu.Unlock()
	w, ok := b.wrote[key]
	if !ok {
		w, ok = b.wo[key]
	}
	return ok && w == rv
}

// Echo reports whether a sync of the parent whose hook would be shown now is
// an echo of the last desired state applied for it.
func (b *Book) Echo(ctrlID, parentUID string, now map[string]string) bool {
	if b == nil || len(now) == 0 {
		return false
	}
	b.mu.Lock()
	last := b.noteLocked(ctrlID + "/" + parentUID)
	b.mu.Unlock()
	return IsEcho(last, now)
}

// Subscribe feeds the Book from AppliedSubject until the subscription ends.
// Malformed notes are ignored: they are hints.
func (b *Book) Subscribe(nc *nats.Conn) (*nats.Subscription, error) {
	return nc.Subscribe(bus.AppliedSubject, func(m *nats.Msg) {
		var a bus.Applied
		if err := json.Unmarshal(m.Data, &a); err == nil {
			b.Record(&a)
		}
	})
}

// Publish broadcasts a note.
func Publish(nc *nats.Conn, a *bus.Applied) error {
	data, err := json.Marshal(a)
	if err != nil {
		return err
	}
	return nc.Publish(bus.AppliedSubject, data)
}
