package apply

import (
	"errors"
	"fmt"
	"hash/fnv"
	"maps"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/ujson"
)

// Strategy is how metabus writes children: upstream Metacontroller's
// --apply-strategy, with its values.
type Strategy string

// The strategies.
const (
	// DynamicApply is the default: the three-way merge of this package,
	// with the last applied configuration kept in LastAppliedAnnotation,
	// written with an update carrying the observed resourceVersion.
	DynamicApply Strategy = "dynamic-apply"
	// ServerSideApply sends the hook's object as an apply patch
	// (application/apply-patch+yaml) with force, and lets the API server
	// merge it by field ownership.
	ServerSideApply Strategy = "server-side-apply"
)

// DefaultFieldManager is upstream's default
// --apply-strategy-ssa-field-manager: children applied by metabus are
// owned by the same manager as those upstream applied.
const DefaultFieldManager = "metacontroller"

// ParseStrategy reads an --apply-strategy value; "" is the default.
func ParseStrategy(s string) (Strategy, error) {
	switch Strategy(s) {
	case "", DynamicApply:
		return DynamicApply, nil
	case ServerSideApply:
		return ServerSideApply, nil
	}
	return "", fmt.Errorf("unknown apply strategy %q (want %s or %s)", s, DynamicApply, ServerSideApply)
}

// Configuration returns the applied configuration of a desired child for
// server-side apply, as upstream sends it: the hook's object without its
// status (children's status is never metabus's to write), without the
// metadata only the API server sets (uid, resourceVersion, generation,
// timestamps, managedFields, selfLink) and without any copy of
// LastAppliedAnnotation (a hook may echo what it observed; the annotation
// is dynamic apply's bookkeeping). Null fields are left out: a null means
// "absent", as with dynamic apply. desired is not modified.
func Configuration(desired *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	if desired == nil {
		return nil, errors.New("apply: Configuration of a nil object")
	}
	if err := validate(desired.Object); err != nil {
		return nil, fmt.Errorf("apply: desired object: %w", err)
	}
	cfg := cloneDesired(desired.Object).(map[string]any)
	delete(cfg, "status")
	if meta, ok := cfg["metadata"].(map[string]any); ok {
		for _, f := range systemMetadataFields {
			delete(meta, f)
		}
		if ann, ok := meta["annotations"].(map[string]any); ok {
			if _, present := ann[LastAppliedAnnotation]; present {
				delete(ann, LastAppliedAnnotation)
				if len(ann) == 0 {
					delete(meta, "annotations")
				}
			}
		}
	}
	return &unstructured.Unstructured{Object: cfg}, nil
}

// Settled reports whether observed already holds every value of the
// applied configuration cfg, so that applying it changes no value.
// Applying it may still change field ownership (take over fields another
// manager set to the same values) or remove fields an earlier
// configuration of the same manager had and cfg lacks; the observed
// object, without its managedFields, cannot tell, so Settled says nothing
// about those (see Applied.Covers).
//
// Objects match field by field: a field of cfg must be in observed with
// a matching value, while fields only observed has (defaults, other
// writers' fields) are ignored. An associative list (detected by the
// conventional keys of this package's merge) matches when each of cfg's
// items matches the observed item with the same key, in the same relative
// order; observed may hold more items (an injected sidecar). Any other
// list matches an observed list of the same length item by item. Scalars
// compare by JSON value (numbers by value). An absent observed object
// matches an empty one. The comparison errs towards "not settled": that
// only costs an apply the API server finds to be a no-op.
func Settled(observed, cfg map[string]any) bool {
	return subsetObject(cfg, observed)
}

func subsetObject(cfg, observed map[string]any) bool {
	for k, cv := range cfg {
		ov, ok := observed[k]
		if !ok || ov == nil {
			if !emptyValue(cv) {
				return false
			}
			continue
		}
		if !subsetValue(cv, ov) {
			return false
		}
	}
	return true
}

// emptyValue reports a configured value that sets nothing: null, an
// empty list (the API server stores none) or an object with nothing set
// inside.
func emptyValue(v any) bool {
	switch t := v.(type) {
	case nil:
		return true
	case []any:
		return len(t) == 0
	case map[string]any:
		for _, e := range t {
			if !emptyValue(e) {
				return false
			}
		}
		return true
	}
	return false
}

func subsetValue(cv, ov any) bool {
	switch c := cv.(type) {
	case nil:
		return ov == nil
	case map[string]any:
		o, ok := ov.(map[string]any)
		return ok && subsetObject(c, o)
	case []any:
		o, ok := ov.([]any)
		if !ok {
			return false
		}
		return subsetList(c, o)
	default:
		return equalJSON(cv, ov)
	}
}

func subsetList(cfg, observed []any) bool {
	keys, ok := detectListMap(observed, nil, cfg)
	if !ok {
		if len(cfg) != len(observed) {
			return false
		}
		for i := range cfg {
			if !subsetValue(cfg[i], observed[i]) {
				return false
			}
		}
		return true
	}
	at := newKeyIndex(keys.observed)
	occurrence := occurrences(keys.desired)
	last := -1
	for j, item := range cfg {
		i := at.nth(keys.desired[j], occurrence[j])
		if i <= last || !subsetObject(item.(map[string]any), observed[i].(map[string]any)) {
			return false
		}
		last = i
	}
	return true
}

// Changes reports whether an apply's dry run (the object as the API
// server would store it) differs from observed in anything but the
// fields nobody applies: server-owned metadata (managedFields among
// them), status, and LastAppliedAnnotation. This is upstream's test
// before it deletes a Recreate child under server-side apply: a change of
// ownership alone never recreates a child.
func Changes(observed, dryRun map[string]any) bool {
	return !equalJSON(comparable(observed), comparable(dryRun))
}

// comparable is obj without the fields Changes ignores (a shallow copy
// where they are removed).
func comparable(obj map[string]any) map[string]any {
	out := maps.Clone(obj)
	delete(out, "status")
	meta, _ := out["metadata"].(map[string]any)
	meta = maps.Clone(meta)
	for _, f := range systemMetadataFields {
		delete(meta, f)
	}
	if ann, ok := meta["annotations"].(map[string]any); ok {
		if _, present := ann[LastAppliedAnnotation]; present {
			ann = maps.Clone(ann)
			delete(ann, LastAppliedAnnotation)
			if len(ann) == 0 {
				delete(meta, "annotations")
			} else {
				meta["annotations"] = ann
			}
		}
	}
	if meta != nil {
		out["metadata"] = meta
	}
	return out
}

// Encode is the body of a server-side apply of cfg and the hash of cfg
// that Applied records. uid and resourceVersion, if not "", are added to
// the body (not to the hash) as the apply's preconditions, which the API
// server checks (and records no ownership of): a child changed since it
// was observed, or deleted (an apply would create it again), yields a
// conflict and a new sync rather than an apply on top of a version the
// hook never saw.
func Encode(cfg *unstructured.Unstructured, uid, resourceVersion string) (body []byte, hash uint64, err error) {
	raw, err := ujson.Marshal(cfg.Object)
	if err != nil {
		return nil, 0, fmt.Errorf("apply: encode the configuration of %s: %w", cfg.GetName(), err)
	}
	h := fnv.New64a()
	_, _ = h.Write(raw)
	if uid == "" && resourceVersion == "" {
		return raw, h.Sum64(), nil
	}
	withPre := maps.Clone(cfg.Object)
	meta, _ := withPre["metadata"].(map[string]any)
	meta = maps.Clone(meta)
	if meta == nil {
		meta = map[string]any{}
	}
	if uid != "" {
		meta["uid"] = uid
	}
	if resourceVersion != "" {
		meta["resourceVersion"] = resourceVersion
	}
	withPre["metadata"] = meta
	if body, err = ujson.Marshal(withPre); err != nil {
		return nil, 0, fmt.Errorf("apply: encode the configuration of %s: %w", cfg.GetName(), err)
	}
	return body, h.Sum64(), nil
}

// Applied is what a server-side apply of one child left behind, as the
// applier remembers it: the object it applied to, the hash of the
// configuration (Encode), and the object's generation and
// resourceVersion after the apply.
type Applied struct {
	UID             string
	Hash            uint64
	Generation      int64
	ResourceVersion string
}

// Covers reports whether applying the configuration with hash to
// observed would only repeat this apply, when observed is Settled: the
// same object, the same configuration, and no change of its spec since
// (the same generation; the same resourceVersion for objects without a
// generation), so the fields the manager owns are the configuration's.
// That is upstream's skip rule; with Settled before it, a value someone
// else changed since is also seen, whatever the generation.
func (a Applied) Covers(observed *unstructured.Unstructured, hash uint64) bool {
	if a.UID == "" || a.UID != string(observed.GetUID()) || a.Hash != hash {
		return false
	}
	if g := observed.GetGeneration(); g != 0 || a.Generation != 0 {
		return g == a.Generation
	}
	return a.ResourceVersion == observed.GetResourceVersion()
}

// Repeats reports whether applying the configuration with hash to
// observed would repeat this apply exactly: the same object, untouched
// since (the same resourceVersion), and the same configuration. It holds
// whether or not observed is Settled: a configuration whose values the
// API server stores in another form (a quantity "0.5" stored as "500m")
// is never Settled, and the apply (or the dry run of a Recreate) found to
// change nothing is not repeated until the object or the configuration
// changes.
func (a Applied) Repeats(observed *unstructured.Unstructured, hash uint64) bool {
	return a.UID != "" && a.UID == string(observed.GetUID()) && a.Hash == hash &&
		a.ResourceVersion != "" && a.ResourceVersion == observed.GetResourceVersion()
}
