// Package bus is the single home of metabus' wire contracts on NATS
// JetStream: subjects, CloudEvent types and their encoding, the message
// schemas exchanged by the watcher, dispatcher, applier and revisions
// services, and the stream, consumer and bucket configurations, all as
// plain data. It links no NATS client (internal/layers TestCoresLinkNoTransport), so
// that the pure cores and the kind cores can import it; package jsbus runs
// the bus on JetStream from these contracts.
//
// Delivery model (docs/architecture.md): Kubernetes is the system of
// record, every message can be derived again, delivery is at least once and
// every consumer is idempotent. Per-parent serialization comes from
// partitioning each stream (layout.go) with a subject transform, giving each
// partition's durable consumer one owner at a time by lease (owners.go), and
// running each parent's messages one at a time inside the owner (package
// jsbus, package ownership, package fairq). A MapController's unit of work
// is (parent, map key) instead: a keyed item is serialized, deduplicated and
// ordered per (parent, key) by carrying the key in its parent's subject
// token (MapKeySep), and its per-parent item is one more such unit.
package bus

import (
	"fmt"
	"hash/fnv"
	"strings"
)

// Slots is the number of hash slots the streams' subject transform spreads
// parents over. The stored subject of a message is
// <root>.<slot mod 64>.<slot>.<ctrl>.<uid> with slot = Slot(ctrl, uid): a
// fixed wire contract. Partitions (the unit of ownership, a setting) are
// sets of slots (layout.go), so changing the partition count moves no
// message. The leading slot mod 64 token lets a partition of the default
// layout be one wildcard filter: a WorkQueue stream checks every
// consumer's filters on every acknowledgement, and 16 filters per
// consumer cost 5% of an all-in-one process's CPU there.
const Slots = 1024

// groups is the number of values of the first slot token (slot mod groups).
const groups = 64

// Subject roots. Publishers address a (controller, parent) pair; the streams
// insert the partition token when storing.
const (
	workRoot    = "mc.work"
	desiredRoot = "mc.desired"
	schedRoot   = "mc.sched"
	dueRoot     = "mc.due"
	dlqRoot     = "mc.dlq"

	// SnapshotSubject is the request/reply subject of the watcher's
	// observed-state snapshot service (a nats micro service, queue group
	// SnapshotQueue).
	SnapshotSubject = "mc.svc.snapshot"
	// SnapshotQueue is the queue group of the snapshot service.
	SnapshotQueue = "mc-snapshot"
	// SnapshotServiceName is the micro service name of the snapshot service.
	SnapshotServiceName = "metabus-snapshot"

	// RevisionsSubject is the request/reply subject of the revisions
	// service, which owns ControllerRevision objects (a nats micro service,
	// queue group RevisionsQueue; schema in package revstore).
	RevisionsSubject = "mc.svc.revisions"
	// RevisionsQueue is the queue group of the revisions service.
	RevisionsQueue = "mc-revisions"
	// RevisionsServiceName is the micro service name of the revisions service.
	RevisionsServiceName = "metabus-revisions"
)

// ControllerID returns the subject token that identifies a controller: the
// lower-case initials of its kind, "-", and its name: "cc-<name>" for a
// CompositeController, "dc-<name>" for a DecoratorController, "mc-<name>"
// for a MapController. The prefix is derived, not looked up, so that the bus
// needs no list of kinds (package kindtable checks that the kinds it serves
// have distinct prefixes). Kubernetes names may contain ".", the NATS token
// separator, but never "_", so "." is mapped to "_" reversibly.
func ControllerID(kind, name string) string {
	var b strings.Builder
	b.Grow(len(kind) + 1 + len(name))
	writeControllerID(&b, kind, name)
	return b.String()
}

// writeControllerID writes ControllerID(kind, name) to b: keys built on it
// (ItemKey) are then one allocation, where the concatenation of its parts
// was four per call, and items' keys are taken many times per message.
func writeControllerID(b *strings.Builder, kind, name string) {
	n := b.Len()
	for _, r := range kind {
		if r >= 'A' && r <= 'Z' {
			b.WriteByte(byte(r - 'A' + 'a'))
		}
	}
	if b.Len() == n {
		b.WriteByte('x')
	}
	b.WriteByte('-')
	for i := range len(name) {
		if c := name[i]; c == '.' {
			b.WriteByte('_')
		} else {
			b.WriteByte(c)
		}
	}
}

// KindIDPrefix is the lower-case initials of a kind ("x" if it has none).
func KindIDPrefix(kind string) string {
	var b strings.Builder
	for _, r := range kind {
		if r >= 'A' && r <= 'Z' {
			b.WriteRune(r - 'A' + 'a')
		}
	}
	if b.Len() == 0 {
		return "x"
	}
	return b.String()
}

// validToken reports whether s can be used as one NATS subject token.
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r == '.' || r == '*' || r == '>' || r <= ' ' || r > '~' {
			return false
		}
	}
	return true
}

func key(root, ctrlID, parentUID string) (string, error) {
	if !validToken(ctrlID) || !validToken(parentUID) {
		return "", fmt.Errorf("invalid subject tokens %q/%q", ctrlID, parentUID)
	}
	return root + "." + ctrlID + "." + parentUID, nil
}

// WorkSubject is where work items for a parent are published:
// mc.work.<ctrlID>.<parentUID>. The UID, not the name, keys the parent:
// names may contain "." and a recreated object is a different parent.
func WorkSubject(ctrlID, parentUID string) (string, error) {
	return key(workRoot, ctrlID, parentUID)
}

// DesiredSubject is where desired states for a parent are published:
// mc.desired.<ctrlID>.<parentUID>.
func DesiredSubject(ctrlID, parentUID string) (string, error) {
	return key(desiredRoot, ctrlID, parentUID)
}

// StoredDesiredSubject is the subject MC_DESIRED stores a parent's desired
// states under, after the partition transform. The applier reads the last
// message of this subject to skip superseded desired states.
func StoredDesiredSubject(ctrlID, parentUID string) string {
	return storedSubject(desiredRoot, ctrlID, parentUID)
}

// StoredWorkSubject is the subject MC_WORK stores a parent's work items under.
func StoredWorkSubject(ctrlID, parentUID string) string {
	return storedSubject(workRoot, ctrlID, parentUID)
}

// StoredWorkFilter is a subject filter matching every work item of a
// controller stored in MC_WORK, whatever its parent and slot.
func StoredWorkFilter(ctrlID string) string { return workRoot + ".*.*." + ctrlID + ".*" }

func storedSubject(root, ctrlID, parentUID string) string {
	slot := Slot(ctrlID, parentUID)
	return fmt.Sprintf("%s.%d.%d.%s.%s", root, slot%groups, slot, ctrlID, parentUID)
}

// MapKeySep joins a parent UID and a map key into one parent token,
// <parentUID>~<mapKey>, which stands where the parent UID stands in every
// subject of a keyed (MapController) item: work, desired, schedule, due and
// dead-letter subjects. One token, not an extra one, because everything
// that routes or guards these subjects counts tokens: the streams'
// subjects (mc.work.*.*), their partition transforms, the partition
// consumers' filters, ParseStoredSubject and ParseKeySubject, and the
// NATS publish permissions in deploy/ (mc.work.*.*, mc.desired.*.*,
// mc.sched.*.*). So a keyed item needs no new stream, consumer or
// permission, and:
//   - MC_WORK's per-subject limit deduplicates per (parent, key), since
//     each key has its own stored subject;
//   - the server's {{partition(1024,1,2)}} hashes the whole token, so a
//     keyed item's slot is a hash of (controller, parent, key) and the keys
//     of one parent spread over the partitions, while one key always lands
//     in the same slot and its desired states stay in order;
//   - a keyless item's token is its UID alone: its subjects and slot are
//     what they always were.
//
// "~" is safe as the separator: Kubernetes UIDs are UUIDs (hex digits and
// "-"), map keys are lower-case base32 (package mapctl), and both are
// checked to hold no "~" before a keyed subject is built, so the token
// splits back unambiguously at its last "~".
const MapKeySep = "~"

// ParentToken is the subject token of a parent's item: the parent UID for
// the per-parent item (mapKey ""), <parentUID>~<mapKey> for a keyed one.
func ParentToken(parentUID, mapKey string) string {
	if mapKey == "" {
		return parentUID
	}
	return parentUID + MapKeySep + mapKey
}

// SplitParentToken reverses ParentToken: a token without "~" is a parent
// UID with no map key.
func SplitParentToken(token string) (parentUID, mapKey string) {
	if i := strings.LastIndex(token, MapKeySep); i >= 0 {
		return token[:i], token[i+len(MapKeySep):]
	}
	return token, ""
}

// CheckedParentToken is ParentToken for a subject being built: it refuses
// a key or a keyed UID that would not split back, or would not be one
// subject token, so that no input can address another parent's or key's
// subject.
func CheckedParentToken(parentUID, mapKey string) (string, error) {
	if mapKey == "" {
		return parentUID, nil // unchanged for keyless items
	}
	if !validToken(mapKey) || strings.Contains(mapKey, MapKeySep) {
		return "", fmt.Errorf("invalid map key %q: want one subject token without %q", mapKey, MapKeySep)
	}
	if !validToken(parentUID) || strings.Contains(parentUID, MapKeySep) {
		return "", fmt.Errorf("invalid parent UID %q for map key %q", parentUID, mapKey)
	}
	return ParentToken(parentUID, mapKey), nil
}

// StoredWorkSubjectKey is StoredWorkSubject for (parent, map key); with
// mapKey "" it is StoredWorkSubject.
func StoredWorkSubjectKey(ctrlID, parentUID, mapKey string) string {
	return storedSubject(workRoot, ctrlID, ParentToken(parentUID, mapKey))
}

// StoredDesiredSubjectKey is StoredDesiredSubject for (parent, map key):
// the subject whose last message tells the applier whether a keyed desired
// state is superseded; with mapKey "" it is StoredDesiredSubject.
func StoredDesiredSubjectKey(ctrlID, parentUID, mapKey string) string {
	return storedSubject(desiredRoot, ctrlID, ParentToken(parentUID, mapKey))
}

// SlotKey is the slot of (controller, parent, map key): Slot of the parent
// token, as the server computes it; with mapKey "" it is Slot.
func SlotKey(ctrlID, parentUID, mapKey string) int {
	return Slot(ctrlID, ParentToken(parentUID, mapKey))
}

// ParseStoredSubjectKey is ParseStoredSubject with the parent token split
// into parent UID and map key ("" for a per-parent item).
func ParseStoredSubjectKey(subject string) (slot int, ctrlID, parentUID, mapKey string, err error) {
	slot, ctrlID, token, err := ParseStoredSubject(subject)
	if err != nil {
		return 0, "", "", "", err
	}
	parentUID, mapKey = SplitParentToken(token)
	return slot, ctrlID, parentUID, mapKey, nil
}

// SchedSubject holds the single pending schedule (retry or resync) of a
// parent: re-publishing it replaces the earlier schedule.
func SchedSubject(ctrlID, parentUID string) (string, error) {
	return key(schedRoot, ctrlID, parentUID)
}

// DueSubject is the target a schedule fires into; the relay moves due
// messages into MC_WORK.
func DueSubject(ctrlID, parentUID string) (string, error) {
	return key(dueRoot, ctrlID, parentUID)
}

// DLQSubject is where poison messages of a stage are parked.
func DLQSubject(stage, ctrlID, parentUID string) string {
	return dlqRoot + "." + stage + "." + ctrlID + "." + parentUID
}

// Slot computes the slot the server's {{partition(1024,1,2)}} transform
// assigns to (ctrlID, parentUID) (its {{partition(64,1,2)}} is slot mod 64): FNV-1a 32 over the two tokens
// concatenated without a separator, modulo Slots. Clients use it to address
// stored subjects and to find a parent's partition (PartitionOf).
func Slot(ctrlID, parentUID string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(ctrlID))
	_, _ = h.Write([]byte(parentUID))
	return int(h.Sum32() % Slots)
}

// ParseStoredSubject splits a stored subject
// <root>.<slot mod 64>.<slot>.<ctrlID>.<parentUID>, or
// <root>.<slot mod 64>.<ctrlID>.<parentUID> as stored before slots. For a
// keyed item the last value is the parent token <parentUID>~<mapKey>
// (MapKeySep), which is what per-(parent, key) callers key by; use
// ParseStoredSubjectKey or SplitParentToken to separate the two.
func ParseStoredSubject(subject string) (slot int, ctrlID, parentUID string, err error) {
	parts := strings.Split(subject, ".")
	token := 3
	switch len(parts) {
	case 6:
	case 5:
		token = 2 // legacy: the slot mod 64 is all there is
	default:
		return 0, "", "", fmt.Errorf("unexpected stored subject %q", subject)
	}
	if _, err := fmt.Sscanf(parts[token], "%d", &slot); err != nil {
		return 0, "", "", fmt.Errorf("unexpected slot in %q: %w", subject, err)
	}
	return slot, parts[len(parts)-2], parts[len(parts)-1], nil
}

// ParseKeySubject splits an unpartitioned subject <a>.<b>.<ctrlID>.<parentUID>
// (a due or schedule subject). For a keyed item parentUID is the parent
// token <parentUID>~<mapKey>; SplitParentToken separates it.
func ParseKeySubject(subject string) (ctrlID, parentUID string, err error) {
	parts := strings.Split(subject, ".")
	if len(parts) != 4 {
		return "", "", fmt.Errorf("unexpected subject %q", subject)
	}
	return parts[2], parts[3], nil
}
