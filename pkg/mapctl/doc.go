// Package mapctl is the pure core of MapController (issue #11): for every
// input object a parent selects, call the map hook and keep the outputs it
// returns, owned by the parent and grouped by the input they came from.
// It decides; it never performs I/O. The services do the watching, hook
// calls and writes around it.
//
// # What it provides
//
//   - Decode and Validate: the controller object and its spec (a parent
//     resource, at least one input and one output resource, a map hook);
//     CheckScopes once discovery has resolved the resources' scopes.
//   - Map keys (InputRef, Key): an opaque, stable key per input object,
//     derived from its API group, kind, namespace, name and UID, encoded as
//     52 lower-case base32 characters so that it is at once a label value
//     and a NATS subject token. Outputs carry it in MapKeyLabel and name
//     their input in InputAnnotation (group/kind/namespace/name/uid).
//   - Input selection (SelectInputs): the parent's duck-typed spec.selector
//     (absent or empty: every object), its namespace when it is namespaced
//     (every namespace, and cluster-scoped inputs, when it is not), never
//     an object the parent itself controls.
//   - Outputs by key (ForKey, Keys, Detached, OutputOwner): the outputs a
//     map hook call is shown and may change, and the keys whose input is
//     gone.
//   - The tombstone decision (DecideTombstone): which outputs of a
//     detached key are kept and which deleted, with or without a tombstone
//     hook.
//   - Status aggregation (Aggregate, MergeStatus, ConditionName): input
//     and output totals, per-condition counts of outputs, and the
//     observedGeneration, written only when they changed.
//
// MapController has no finalizer (Finalizer returns ""): the design gives
// it no finalize hook, since the garbage collector deletes a parent's
// outputs with it and tombstones are about vanished inputs.
//
// # Decisions where the issue is silent
//
//   - Outputs never roll out; their update methods are OnDelete, Recreate
//     and InPlace (the CRD rejects Rolling*).
//   - No adoption: one input can be selected by several parents, so its key
//     does not say which parent an orphan output belongs to.
//   - An owned output without a well-formed key label belongs to no input:
//     it is never shown to a hook nor swept, only counted in the status.
//   - An input that stops being selected (labels or the parent's selector
//     changed) is gone for its parent: its outputs are detached.
//   - Outputs already being deleted never make a key detached and are
//     neither kept nor deleted by a tombstone decision.
//
// # Plugging into the kinds seam (the wiring task)
//
// The core does not implement kinds.Controller yet: that needs work items,
// snapshots and desired states per (parent, map key) on the bus (design
// §10). The intended mapping, piece by piece:
//
//   - Controller: Decode in New; Ref with v1alpha1.MapControllerKind;
//     FinalizerName and Finalizer ""; the kind-table row's Finalizer is
//     this package's Finalizer. The dispatcher's controller-gone path must
//     then skip the release of an empty finalizer, and
//     TestFinalizerOfDeletedController must accept "" for this kind.
//   - Watching: WatchResources lists spec.parentResource,
//     spec.inputResources[i] and spec.outputResources[i]. WatchPlan: the
//     parent resource as the only parent source (IgnoreStatusChanges: the
//     parent's status is metabus's own aggregation); Owned are the output
//     resources (one snapshot group each); Adopts false; Finalizer "";
//     CheckScopes on the resolved scopes. Rules: Selects every parent,
//     OwnerRef is the controller reference, WantsOrphan false, Observe the
//     owned outputs. What the seam lacks is the input sources: an event on
//     an input resource maps to every parent whose SelectInputs selects
//     it (Namespace and Selector let the watcher list from its indexes),
//     and becomes a work item for (parent, InputRef.Key); a parent event
//     or resync becomes one per-parent item that fans out to its keys. A
//     per-key snapshot is the parent, the one input (none when detached)
//     and ForKey of the outputs.
//   - Syncing: SyncEndpoints is spec.endpointConfigs; no customize hook;
//     SyncGate skips a parent being deleted (the garbage collector owns its
//     outputs) and fails on a SelectInputs error; echoable. SyncHook picks
//     the map hook for a key whose input is live, the tombstone hook for a
//     detached key (nothing to call without one: DecideTombstone(nil)
//     deletes). SyncCalls builds one hookapi.MapRequest (the outputs map
//     from ForKey, as kinds.ObjectMaps builds children) or
//     hookapi.TombstoneRequest; no revisions. SyncDesired turns a
//     MapResponse into the key's desired outputs and resync, and a
//     TombstoneResponse, through DecideTombstone, into the kept outputs as
//     observed (or explicit deletes, whichever the desired state grows).
//     The per-parent item calls no hook: it computes Detached from the
//     live keys and the outputs, and Aggregate.
//   - Applying: ApplyChildRules are spec.outputResources with OutputMethod
//     (Field "spec.outputResources", Noun "outputs"); ApplyOwner is
//     OutputOwner for the key's input (the desired state must carry it),
//     and the applier plans with that key's observed outputs only;
//     ApplyClaims and ApplyRollout false; ApplyParent writes no finalizer
//     and, for the per-parent item, the status from MergeStatus when it
//     changed.
package mapctl
