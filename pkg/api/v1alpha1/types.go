// Package v1alpha1 holds the metacontroller.k8s.io/v1alpha1 API types:
// CompositeController, DecoratorController, MapController and
// ControllerRevision.
//
// The JSON shapes are wire-compatible with upstream Metacontroller so that
// existing manifests and hooks work unchanged. MapController has no upstream
// release (only a design proposal): metabus defines its shape, reusing the
// upstream resource rules, update methods and hooks. The types are plain structs
// decoded from unstructured objects (the services only read them through
// dynamic informers), so no generated clientset or deepcopy is needed.
package v1alpha1

import (
	"encoding/json"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Group and version of the API.
const (
	Group   = "metacontroller.k8s.io"
	Version = "v1alpha1"
)

// GroupVersion is metacontroller.k8s.io/v1alpha1.
var GroupVersion = schema.GroupVersion{Group: Group, Version: Version}

// Resources served by the CRDs in deploy/crds.
var (
	CompositeControllerGVR = GroupVersion.WithResource("compositecontrollers")
	DecoratorControllerGVR = GroupVersion.WithResource("decoratorcontrollers")
	MapControllerGVR       = GroupVersion.WithResource("mapcontrollers")
	ControllerRevisionGVR  = GroupVersion.WithResource("controllerrevisions")
)

// Kinds.
const (
	CompositeControllerKind = "CompositeController"
	DecoratorControllerKind = "DecoratorController"
	MapControllerKind       = "MapController"
	ControllerRevisionKind  = "ControllerRevision"
)

// CompositeController manages a set of children for each parent object.
type CompositeController struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   CompositeControllerSpec   `json:"spec"`
	Status CompositeControllerStatus `json:"status,omitempty"`
}

// CompositeControllerSpec is the spec of a CompositeController.
type CompositeControllerSpec struct {
	ParentResource      CompositeControllerParentResourceRule  `json:"parentResource"`
	ChildResources      []CompositeControllerChildResourceRule `json:"childResources,omitempty"`
	Hooks               *CompositeControllerHooks              `json:"hooks,omitempty"`
	ResyncPeriodSeconds *int32                                 `json:"resyncPeriodSeconds,omitempty"`
	GenerateSelector    *bool                                  `json:"generateSelector,omitempty"`
	EndpointConfigs     []EndpointConfig                       `json:"endpointConfigs,omitempty"`
}

// ResourceRule names a resource by API version and plural resource name.
type ResourceRule struct {
	APIVersion string `json:"apiVersion"`
	Resource   string `json:"resource"`
}

// CompositeControllerParentResourceRule selects the parent resource.
type CompositeControllerParentResourceRule struct {
	ResourceRule        `json:",inline"`
	RevisionHistory     *CompositeControllerRevisionHistory `json:"revisionHistory,omitempty"`
	LabelSelector       *metav1.LabelSelector               `json:"labelSelector,omitempty"`
	IgnoreStatusChanges *bool                               `json:"ignoreStatusChanges,omitempty"`
}

// CompositeControllerRevisionHistory selects the parent fields that roll out gradually.
type CompositeControllerRevisionHistory struct {
	FieldPaths []string `json:"fieldPaths,omitempty"`
}

// CompositeControllerChildResourceRule declares one child resource.
type CompositeControllerChildResourceRule struct {
	ResourceRule   `json:",inline"`
	UpdateStrategy *CompositeControllerChildUpdateStrategy `json:"updateStrategy,omitempty"`
}

// ChildUpdateMethod says how existing children are updated.
type ChildUpdateMethod string

// Update methods.
const (
	ChildUpdateOnDelete        ChildUpdateMethod = "OnDelete"
	ChildUpdateRecreate        ChildUpdateMethod = "Recreate"
	ChildUpdateInPlace         ChildUpdateMethod = "InPlace"
	ChildUpdateRollingRecreate ChildUpdateMethod = "RollingRecreate"
	ChildUpdateRollingInPlace  ChildUpdateMethod = "RollingInPlace"
)

// CompositeControllerChildUpdateStrategy is a child resource's update strategy.
type CompositeControllerChildUpdateStrategy struct {
	Method       ChildUpdateMethod                    `json:"method,omitempty"`
	StatusChecks CompositeControllerChildStatusChecks `json:"statusChecks,omitempty"`
}

// CompositeControllerChildStatusChecks gate rolling updates.
type CompositeControllerChildStatusChecks struct {
	Conditions []StatusConditionCheck `json:"conditions,omitempty"`
}

// StatusConditionCheck requires a status condition of a child.
type StatusConditionCheck struct {
	Type   string  `json:"type"`
	Status *string `json:"status,omitempty"`
	Reason *string `json:"reason,omitempty"`
}

// CompositeControllerHooks are the hooks of a CompositeController.
type CompositeControllerHooks struct {
	Sync      *Hook `json:"sync,omitempty"`
	Finalize  *Hook `json:"finalize,omitempty"`
	Customize *Hook `json:"customize,omitempty"`
	// PreUpdateChild and PostUpdateChild are accepted for compatibility;
	// upstream declares but never calls them.
	PreUpdateChild  *Hook `json:"preUpdateChild,omitempty"`
	PostUpdateChild *Hook `json:"postUpdateChild,omitempty"`
}

// CompositeControllerStatus is empty, as upstream.
type CompositeControllerStatus struct{}

// DecoratorController attaches children and metadata to existing objects.
type DecoratorController struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   DecoratorControllerSpec   `json:"spec"`
	Status DecoratorControllerStatus `json:"status,omitempty"`
}

// DecoratorControllerSpec is the spec of a DecoratorController.
type DecoratorControllerSpec struct {
	Resources           []DecoratorControllerResourceRule   `json:"resources"`
	Attachments         []DecoratorControllerAttachmentRule `json:"attachments,omitempty"`
	Hooks               *DecoratorControllerHooks           `json:"hooks,omitempty"`
	ResyncPeriodSeconds *int32                              `json:"resyncPeriodSeconds,omitempty"`
	EndpointConfigs     []EndpointConfig                    `json:"endpointConfigs,omitempty"`
}

// DecoratorControllerResourceRule selects target objects.
type DecoratorControllerResourceRule struct {
	ResourceRule        `json:",inline"`
	LabelSelector       *metav1.LabelSelector `json:"labelSelector,omitempty"`
	AnnotationSelector  *AnnotationSelector   `json:"annotationSelector,omitempty"`
	IgnoreStatusChanges *bool                 `json:"ignoreStatusChanges,omitempty"`
}

// AnnotationSelector is a label-selector-shaped selector over annotations.
type AnnotationSelector struct {
	MatchAnnotations map[string]string                 `json:"matchAnnotations,omitempty"`
	MatchExpressions []metav1.LabelSelectorRequirement `json:"matchExpressions,omitempty"`
}

// DecoratorControllerAttachmentRule declares one attachment resource.
type DecoratorControllerAttachmentRule struct {
	ResourceRule   `json:",inline"`
	UpdateStrategy *DecoratorControllerAttachmentUpdateStrategy `json:"updateStrategy,omitempty"`
}

// DecoratorControllerAttachmentUpdateStrategy is an attachment's update strategy.
type DecoratorControllerAttachmentUpdateStrategy struct {
	Method ChildUpdateMethod `json:"method,omitempty"`
}

// DecoratorControllerHooks are the hooks of a DecoratorController.
type DecoratorControllerHooks struct {
	Sync      *Hook `json:"sync,omitempty"`
	Finalize  *Hook `json:"finalize,omitempty"`
	Customize *Hook `json:"customize,omitempty"`
}

// DecoratorControllerStatus is empty, as upstream.
type DecoratorControllerStatus struct{}

// MapController calls its map hook once per input object (an object it does
// not own, selected by the parent's spec.selector) and keeps the outputs,
// owned by the parent, grouped by the input they came from.
type MapController struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   MapControllerSpec   `json:"spec"`
	Status MapControllerStatus `json:"status,omitempty"`
}

// MapControllerSpec is the spec of a MapController.
type MapControllerSpec struct {
	ParentResource ResourceRule `json:"parentResource"`
	// InputResources are read, never written: the parent does not own them.
	InputResources []ResourceRule `json:"inputResources"`
	// OutputResources are owned by the parent (controller reference).
	OutputResources     []MapControllerOutputResourceRule `json:"outputResources"`
	Hooks               *MapControllerHooks               `json:"hooks,omitempty"`
	ResyncPeriodSeconds *int32                            `json:"resyncPeriodSeconds,omitempty"`
	// EndpointConfigs serve the map and tombstone hooks as they serve the
	// other kinds' hooks, so that a webhook's TLS and credentials are
	// configured the same way everywhere.
	EndpointConfigs []EndpointConfig `json:"endpointConfigs,omitempty"`
}

// MapControllerOutputResourceRule declares one output resource.
type MapControllerOutputResourceRule struct {
	ResourceRule   `json:",inline"`
	UpdateStrategy *MapControllerOutputUpdateStrategy `json:"updateStrategy,omitempty"`
}

// OutputUpdateMethod says how existing outputs are updated. It is a type of
// its own rather than ChildUpdateMethod because outputs never roll out (a
// rollout is paced across one parent's children by ControllerRevisions,
// while a MapController's keys are synced independently), so the CRD
// rejects the Rolling* methods instead of silently downgrading them.
type OutputUpdateMethod string

// Output update methods: the non-rolling child update methods.
const (
	OutputUpdateOnDelete OutputUpdateMethod = "OnDelete"
	OutputUpdateRecreate OutputUpdateMethod = "Recreate"
	OutputUpdateInPlace  OutputUpdateMethod = "InPlace"
)

// MapControllerOutputUpdateStrategy is an output resource's update strategy.
type MapControllerOutputUpdateStrategy struct {
	Method OutputUpdateMethod `json:"method,omitempty"`
}

// MapControllerHooks are the hooks of a MapController.
type MapControllerHooks struct {
	// Map is called once per input object (required).
	Map *Hook `json:"map,omitempty"`
	// Tombstone, when set, decides which outputs of a vanished input are
	// kept; without it they are deleted.
	Tombstone *Hook `json:"tombstone,omitempty"`
}

// MapControllerStatus is empty, like the other kinds' (the aggregated
// status is written on the parents, not on the controller).
type MapControllerStatus struct{}

// HookVersion selects the request encoding of a hook.
type HookVersion string

// Hook versions.
const (
	HookVersionV1 HookVersion = "v1"
	HookVersionV2 HookVersion = "v2"
)

// Hook says how to call one hook.
type Hook struct {
	Webhook *Webhook `json:"webhook,omitempty"`
	// NATS calls the hook as a NATS request instead of an HTTP POST (a
	// metabus extension). A hook sets exactly one of webhook and nats.
	NATS    *NATSHook    `json:"nats,omitempty"`
	Version *HookVersion `json:"version,omitempty"`
}

// NATSHook is a hook served over NATS: the dispatcher sends each call as a
// request to Subject and takes the first reply. Hook replicas subscribe in
// a queue group, so one of them answers each call.
type NATSHook struct {
	// Subject is a literal subject (no * or > wildcard) under the
	// dispatcher's allowed hook prefix (hooks. unless configured).
	Subject string `json:"subject"`
	// Timeout bounds the call as webhook.timeout does (same default and
	// maximum).
	Timeout *metav1.Duration `json:"timeout,omitempty"`
	// CloudEvents is the request's content mode: binary (default) or
	// structured.
	CloudEvents *CloudEventsMode `json:"cloudEvents,omitempty"`
	// ResponseUnMarshallMode is as the webhook's.
	ResponseUnMarshallMode *ResponseUnMarshallMode `json:"responseUnMarshallMode,omitempty"`
}

// ResponseUnMarshallMode is how strictly a hook response is decoded.
type ResponseUnMarshallMode string

// Decoding modes.
const (
	ResponseUnMarshallModeLoose  ResponseUnMarshallMode = "loose"
	ResponseUnMarshallModeStrict ResponseUnMarshallMode = "strict"
)

// CloudEventsMode is the CloudEvents content mode of a hook's requests
// (webhook or NATS).
type CloudEventsMode string

// Content modes. Binary is the default: the request body is the hook's JSON
// request unchanged (what a Metacontroller hook has always read), its
// CloudEvents attributes in ce-* headers. Structured sends the whole event
// as one JSON document (Content-Type application/cloudevents+json), for
// hooks built on a CloudEvents SDK or behind a broker that wants it. A
// metabus extension.
const (
	CloudEventsBinary     CloudEventsMode = "binary"
	CloudEventsStructured CloudEventsMode = "structured"
)

// Webhook is an HTTP(S) hook endpoint.
type Webhook struct {
	URL                    *string                 `json:"url,omitempty"`
	Timeout                *metav1.Duration        `json:"timeout,omitempty"`
	Path                   *string                 `json:"path,omitempty"`
	Service                *ServiceReference       `json:"service,omitempty"`
	Etag                   *WebhookEtagConfig      `json:"etag,omitempty"`
	ResponseUnMarshallMode *ResponseUnMarshallMode `json:"responseUnMarshallMode,omitempty"`
	// CloudEvents is the content mode of requests: binary (the default)
	// or structured.
	CloudEvents *CloudEventsMode `json:"cloudEvents,omitempty"`
	WebhookAuth `json:",inline"`
}

// WebhookAuth holds the TLS and authentication options of a webhook or an
// endpoint config.
type WebhookAuth struct {
	CABundle      *CABundle      `json:"caBundle,omitempty"`
	ClientTLS     *ClientTLS     `json:"clientTLS,omitempty"`
	Authorization *Authorization `json:"authorization,omitempty"`
	BasicAuth     *BasicAuth     `json:"basicAuth,omitempty"`
	// AllowInsecureCredentials lets authorization and basicAuth credentials (and a user:password
	// in the url) be sent to a plain http:// URL, including a service reference without
	// protocol https. Without it such a call is refused. A metabus extension.
	AllowInsecureCredentials *bool `json:"allowInsecureCredentials,omitempty"`
}

// ServiceReference addresses a hook through a Kubernetes Service.
type ServiceReference struct {
	Name      string  `json:"name"`
	Namespace string  `json:"namespace"`
	Port      *int32  `json:"port,omitempty"`
	Protocol  *string `json:"protocol,omitempty"`
}

// WebhookEtagConfig enables If-None-Match caching of hook responses.
type WebhookEtagConfig struct {
	Enabled             *bool  `json:"enabled,omitempty"`
	CacheTimeoutSeconds *int32 `json:"cacheTimeoutSeconds,omitempty"`
	CacheCleanupSeconds *int32 `json:"cacheCleanupSeconds,omitempty"`
}

// EndpointConfig holds TLS/auth defaults for webhooks on one host.
type EndpointConfig struct {
	Host        string `json:"host"`
	WebhookAuth `json:",inline"`
}

// CABundle is one source of CA certificates.
type CABundle struct {
	Inline       *string      `json:"inline,omitempty"`
	SecretRef    *KeySelector `json:"secretRef,omitempty"`
	ConfigMapRef *KeySelector `json:"configMapRef,omitempty"`
}

// KeySelector names a key of a Secret or ConfigMap.
type KeySelector struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	Key       string `json:"key,omitempty"`
}

// ObjectRef names a namespaced object.
type ObjectRef struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
}

// ClientTLS configures mutual TLS from a kubernetes.io/tls Secret.
type ClientTLS struct {
	SecretRef     ObjectRef `json:"secretRef"`
	CertKey       string    `json:"certKey,omitempty"`
	PrivateKeyKey string    `json:"privateKeyKey,omitempty"`
}

// Authorization sends "Authorization: <type> <token>".
type Authorization struct {
	Type      string      `json:"type,omitempty"`
	SecretRef KeySelector `json:"secretRef"`
}

// BasicAuth sends HTTP basic credentials.
type BasicAuth struct {
	SecretRef   ObjectRef `json:"secretRef"`
	UsernameKey string    `json:"usernameKey,omitempty"`
	PasswordKey string    `json:"passwordKey,omitempty"`
}

// ControllerRevision records a parent revision for rolling updates.
type ControllerRevision struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	ParentPatch json.RawMessage              `json:"parentPatch"`
	Children    []ControllerRevisionChildren `json:"children,omitempty"`
}

// ControllerRevisionChildren lists the children of one group and kind at a revision.
type ControllerRevisionChildren struct {
	APIGroup string   `json:"apiGroup"`
	Kind     string   `json:"kind"`
	Names    []string `json:"names"`
}
