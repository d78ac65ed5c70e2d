package revision

import (
	"crypto/sha1" // names only, not security: the hash upstream uses
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"

	utiljson "k8s.io/apimachinery/pkg/util/json"
)

// Labels metabus puts on every ControllerRevision, besides the parent's pod-template labels.
const (
	LabelAPIGroup = "metacontroller.k8s.io/apiGroup"
	LabelResource = "metacontroller.k8s.io/resource"
	// LabelControllerUID replaces the template labels under generateSelector.
	LabelControllerUID = "controller-uid"
)

const (
	// MaxNameLength is the longest object name the API server accepts (a DNS subdomain).
	MaxNameLength = 253
	hashLength    = 40 // hex SHA-1
	// MaxPrefixLength is what is left of MaxNameLength for "<resource>.<group>" once "-" and
	// the hash are appended: 212, as upstream.
	MaxPrefixLength = MaxNameLength - 1 - hashLength
)

// Name returns the ControllerRevision name for a parent revision, compatible with upstream:
//
//	<resource>.<group, or "core" for "">-<hex sha1(parentUID + canonical JSON of patch)>
//
// The canonical JSON is encoding/json's (object keys sorted, HTML characters escaped) after
// numbers are normalised as the API machinery decodes them, so the name depends only on the
// patch's content, not on key order, formatting or int/float representation. Length rule:
// when "<resource>.<group>" exceeds MaxPrefixLength bytes it is cut to MaxPrefixLength and any
// trailing '.' or '-' is trimmed (which upstream does not do, but such a name would be an
// invalid DNS subdomain anyway), so the name never exceeds MaxNameLength.
//
// The name only makes creation idempotent; revisions are matched by patch, never by name,
// because adopted revisions carry another parent's UID in theirs.
func Name(resource, group, parentUID string, patch map[string]any) (string, error) {
	if resource == "" {
		return "", errors.New("revision: empty parent resource")
	}
	data, err := canonicalJSON(patch)
	if err != nil {
		return "", err
	}
	return nameFor(resource, group, parentUID, data), nil
}

func nameFor(resource, group, parentUID string, canonical []byte) string {
	h := sha1.New()
	h.Write([]byte(parentUID))
	h.Write(canonical)
	if group == "" {
		group = "core"
	}
	prefix := resource + "." + group
	if len(prefix) > MaxPrefixLength {
		prefix = strings.TrimRight(prefix[:MaxPrefixLength], ".-")
	}
	return prefix + "-" + hex.EncodeToString(h.Sum(nil))
}

// canonicalJSON encodes a parent patch deterministically. A nil patch is the empty object,
// like a revision without parentPatch.
func canonicalJSON(patch map[string]any) ([]byte, error) {
	if patch == nil {
		patch = map[string]any{}
	}
	data, err := json.Marshal(patch)
	if err != nil {
		return nil, fmt.Errorf("revision: encode parent patch: %w", err)
	}
	// Decode and encode again so that json.Number("1.0"), float64(1) and int64(1) agree.
	var norm map[string]any
	if err := utiljson.Unmarshal(data, &norm); err != nil {
		return nil, fmt.Errorf("revision: normalise parent patch: %w", err)
	}
	if data, err = json.Marshal(norm); err != nil {
		return nil, fmt.Errorf("revision: encode parent patch: %w", err)
	}
	return data, nil
}

// decodePatch parses a stored parentPatch; empty and null mean the empty object.
func decodePatch(raw json.RawMessage) (map[string]any, []byte, error) {
	var patch map[string]any
	if len(raw) > 0 {
		if err := utiljson.Unmarshal(raw, &patch); err != nil {
			return nil, nil, err
		}
	}
	if patch == nil {
		patch = map[string]any{}
	}
	canonical, err := canonicalJSON(patch)
	return patch, canonical, err
}

// Labels returns the labels of a parent's ControllerRevisions: the parent's
// spec.template.metadata.labels, or only controller-uid=<controllerUID> when controllerUID is
// set (generateSelector), plus the parent's API group and resource. They let a replacement
// parent adopt orphaned revisions through its selector, as it adopts children.
func Labels(parentTemplateLabels map[string]string, controllerUID, group, resource string) map[string]string {
	out := make(map[string]string, len(parentTemplateLabels)+2)
	if controllerUID != "" {
		out[LabelControllerUID] = controllerUID
	} else {
		maps.Copy(out, parentTemplateLabels)
	}
	out[LabelAPIGroup] = group
	out[LabelResource] = resource
	return out
}
