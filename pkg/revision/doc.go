// Package revision keeps the ControllerRevision bookkeeping behind declarative rolling updates
// of CompositeController children (RollingRecreate and RollingInPlace). It does no I/O.
//
// A revision is a snapshot of the parent fields that roll out gradually
// (parentResource.revisionHistory.fieldPaths, "spec" by default), stored as a partial parent
// object (the parent patch), together with the names of the children that belong to it. A child
// keeps being rendered from its own revision's patch until the rollout moves it to the latest
// revision; that is also why a child deleted before its turn comes back as it was, not at the
// latest revision.
//
// One sync of a parent with rolling children, from the caller's side:
//
//  1. patch := ParentPatch(parent, fieldPaths); h := NewHistory(info, ownedRevisions, patch).
//  2. Call the sync hook with the parent itself: that is the latest revision's desired state.
//     h.Track(the rolling children it returned).
//  3. For every other revision in h.Revisions(), call the hook with
//     ApplyPatch(parent, r.Patch, fieldPaths) and take from that result the desired state of
//     the children the revision holds (falling back to the latest result for a child the old
//     revision does not render).
//  4. Let package rollout decide; when it moves a child, h.Move(child, h.Latest()); that child
//     takes the latest desired state in this same sync.
//  5. h.Prune(), then persist h.Changes() BEFORE writing any child, so the rollout's progress
//     survives a restart.
package revision
