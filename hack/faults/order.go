package main

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/metabus/metabus/pkg/bus"
)

// appliedLog records, from the appliers' Applied notes (bus.AppliedSubject,
// sent as each update is written), which desired state (by the MC_WORK
// sequence of the work item that produced it) every update of a parent's
// objects came from, and at which resourceVersion the API server stored
// it. Ordered by resourceVersion, the API server's own order of the
// writes, a parent's work sequences must never go down: otherwise an older
// desired state was applied after a newer one.
//
// The notes are core NATS: one lost with a killed applier or a cut
// connection leaves a gap, never a false report. The suite subscribes on
// every node separately, so a note published on a partitioned node is seen
// too.
type appliedLog struct {
	mu     sync.Mutex
	writes map[writeKey]uint64 // -> work sequence
	notes  int
	bad    int // undecodable notes
	conns  []*nats.Conn
	// upTo, when set, is the last resourceVersion checked: the work
	// sequences start again when MC_WORK is created anew (a cluster that
	// lost its data), so writes after that are not comparable.
	upTo int64
}

// stopAt checks no write stored after resourceVersion rv (the first
// setting wins).
func (l *appliedLog) stopAt(rv int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.upTo == 0 {
		l.upTo = rv
	}
}

// writeKey is one write: the object's resourceVersion after it, for an
// item (parent UID and map key).
type writeKey struct {
	parent, mapKey, uid string
	rv                  int64
}

// startAppliedLog subscribes to the notes through each connection.
func startAppliedLog(conns []*nats.Conn) (*appliedLog, error) {
	l := &appliedLog{writes: map[writeKey]uint64{}, conns: conns}
	for _, nc := range conns {
		if _, err := nc.Subscribe(bus.AppliedSubject, l.record); err != nil {
			l.close()
			return nil, err
		}
		if err := nc.Flush(); err != nil {
			l.close()
			return nil, err
		}
	}
	return l, nil
}

func (l *appliedLog) record(m *nats.Msg) {
	var a bus.Applied
	err := json.Unmarshal(m.Data, &a)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.bad++
		return
	}
	l.notes++
	for _, w := range a.Writes {
		rv, err := strconv.ParseInt(w.To, 10, 64)
		if err != nil {
			continue
		}
		l.writes[writeKey{parent: a.ParentUID, mapKey: a.MapKey, uid: w.UID, rv: rv}] = a.WorkSeq
	}
}

func (l *appliedLog) close() {
	for _, nc := range l.conns {
		nc.Close()
	}
}

// check adds a violation for every write that applied an older desired
// state than a write stored before it, and returns what it looked at.
func (l *appliedLog) check(v violations) (notes, writes, items int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	type write struct {
		uid string
		rv  int64
		seq uint64
	}
	byItem := map[[2]string][]write{}
	for k, seq := range l.writes {
		if l.upTo != 0 && k.rv > l.upTo {
			continue
		}
		item := [2]string{k.parent, k.mapKey}
		byItem[item] = append(byItem[item], write{k.uid, k.rv, seq})
	}
	for item, ws := range byItem {
		sort.Slice(ws, func(i, j int) bool { return ws[i].rv < ws[j].rv })
		var newest write
		for _, w := range ws {
			if w.seq < newest.seq {
				key := item[0]
				if item[1] != "" {
					key += " key " + item[1]
				}
				v.add(invOrder, "parent uid %s: the write of %s at resourceVersion %d applied work seq %d after the write of %s at %d had applied work seq %d",
					key, w.uid, w.rv, w.seq, newest.uid, newest.rv, newest.seq)
				continue
			}
			newest = w
		}
	}
	if l.bad > 0 {
		v.add(invOrder, "%d Applied notes could not be decoded", l.bad)
	}
	checked := 0
	for _, ws := range byItem {
		checked += len(ws)
	}
	return l.notes, checked, len(byItem)
}

// orderSummary is a line for the figures.
func (l *appliedLog) summary(notes, writes, items int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := fmt.Sprintf("%d Applied notes recorded: %d writes of %d parents checked for order", notes, writes, items)
	if l.upTo != 0 {
		s += fmt.Sprintf(" (up to resourceVersion %d, when the NATS cluster lost its data)", l.upTo)
	}
	return s
}
