package hookapi

import "k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

// MapRequest is the body sent to a MapController's map hook: one input object of one parent,
// and the outputs that parent already owns for it. Outputs always encodes as an object ({}
// when empty, with every declared output type present), like CompositeSyncRequest's children.
type MapRequest struct {
	// Controller is the whole MapController as read from the API.
	Controller any                        `json:"controller"`
	Parent     *unstructured.Unstructured `json:"parent"`
	// MapKey identifies the input (and tags its outputs). It is opaque to the hook: it is
	// sent so that a hook may log it or correlate calls, not to be parsed.
	MapKey string                     `json:"mapKey"`
	Input  *unstructured.Unstructured `json:"input"`
	// Outputs are the parent's outputs tagged with MapKey only; outputs of other inputs are
	// neither shown nor touched by this call.
	Outputs ObjectMap `json:"outputs"`
}

// MapResponse is the body returned by a map hook.
type MapResponse struct {
	// Outputs is the complete desired set for this input: observed outputs of the same map
	// key left out are deleted. Every entry was checked while decoding to be an object with
	// apiVersion, kind and metadata.name.
	Outputs OutputList `json:"outputs"`
	// ResyncAfterSeconds asks for one extra sync of this input after that delay; values <= 0
	// mean none.
	ResyncAfterSeconds float64 `json:"resyncAfterSeconds"`
}

// TombstoneRequest is the body sent to a MapController's tombstone hook for the outputs of one
// input that is gone. There is no input: the object may no longer be readable, and the hook
// only decides what to keep, never what the outputs look like (the design proposal's choice).
type TombstoneRequest struct {
	Controller any                        `json:"controller"`
	Parent     *unstructured.Unstructured `json:"parent"`
	MapKey     string                     `json:"mapKey"`
	Outputs    ObjectMap                  `json:"outputs"`
}

// TombstoneResponse is the body returned by a tombstone hook.
type TombstoneResponse struct {
	// Outputs lists the outputs to keep; every other output of the map key is deleted, so an
	// absent, null or empty list deletes them all. Entries name observed outputs (apiVersion,
	// kind, metadata.namespace and metadata.name); the rest of an entry is ignored, since a
	// tombstone hook cannot change the outputs it keeps.
	Outputs OutputList `json:"outputs"`
}

// OutputList is the "outputs" list of a map or tombstone hook response; see ChildList.
type OutputList []*unstructured.Unstructured

// UnmarshalJSON decodes and validates the list; see decodeObjectList.
func (l *OutputList) UnmarshalJSON(data []byte) error {
	objs, err := decodeObjectList(data, "outputs")
	if err != nil {
		return err
	}
	*l = objs
	return nil
}
