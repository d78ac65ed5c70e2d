package hookapi

import "k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

// CompositeSyncRequest is the body sent to a CompositeController's sync and finalize hooks.
// Children and Related always encode as objects ({} when empty), never null.
type CompositeSyncRequest struct {
	// Controller is the whole CompositeController as read from the API (usually an
	// *unstructured.Unstructured), so hooks see every field, including ones metabus ignores.
	Controller any                        `json:"controller"`
	Parent     *unstructured.Unstructured `json:"parent"`
	Children   ObjectMap                  `json:"children"`
	Related    ObjectMap                  `json:"related"`
	// Finalizing is true for the finalize hook and false for sync; it is always sent so that
	// one handler can serve both hooks.
	Finalizing bool `json:"finalizing"`
}

// CompositeSyncResponse is the body returned by a CompositeController's sync or finalize hook.
type CompositeSyncResponse struct {
	// Status replaces the parent's whole .status (it is not merged).
	Status map[string]any `json:"status"`
	// Children is the complete desired set: observed children left out are deleted. Every entry
	// was checked while decoding to be an object with apiVersion, kind and metadata.name.
	Children ChildList `json:"children"`
	// ResyncAfterSeconds asks for one extra sync after that delay; values <= 0 mean none.
	ResyncAfterSeconds float64 `json:"resyncAfterSeconds"`
	// Finalized is only meaningful for the finalize hook: true once cleanup is complete.
	Finalized bool `json:"finalized"`
}
