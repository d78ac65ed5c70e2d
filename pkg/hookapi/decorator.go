package hookapi

import "k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

// DecoratorSyncRequest is the body sent to a DecoratorController's sync and finalize hooks.
// Attachments and Related always encode as objects ({} when empty), never null.
type DecoratorSyncRequest struct {
	// Controller is the whole DecoratorController as read from the API.
	Controller any `json:"controller"`
	// Object is the decorated target object.
	Object      *unstructured.Unstructured `json:"object"`
	Attachments ObjectMap                  `json:"attachments"`
	Related     ObjectMap                  `json:"related"`
	Finalizing  bool                       `json:"finalizing"`
}

// DecoratorSyncResponse is the body returned by a DecoratorController's sync or finalize hook.
type DecoratorSyncResponse struct {
	// Labels and Annotations are applied to the target: a string value sets the key, a JSON
	// null (nil pointer) removes it, and keys not mentioned are left alone.
	Labels      map[string]*string `json:"labels"`
	Annotations map[string]*string `json:"annotations"`
	// Status replaces the target's .status when non-nil; nil (absent or null) leaves it
	// unchanged, because decorated objects usually have a status owned by someone else.
	Status map[string]any `json:"status"`
	// Attachments is the complete desired set of attachments; observed ones left out are deleted.
	Attachments        AttachmentList `json:"attachments"`
	ResyncAfterSeconds float64        `json:"resyncAfterSeconds"`
	Finalized          bool           `json:"finalized"`
}
