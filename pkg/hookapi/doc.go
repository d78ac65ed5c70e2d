// Package hookapi defines the JSON bodies exchanged with sync, finalize and customize hooks of
// CompositeControllers and DecoratorControllers, and with map and tombstone hooks of
// MapControllers.
//
// The shapes are the upstream Metacontroller wire contract, byte for byte where it matters, so
// that hooks written for Metacontroller work unchanged against metabus. MapController has no
// upstream release; its bodies follow the design proposal and reuse the conventions below
// (object maps for observed outputs, validated lists for desired ones). The package is pure: it
// builds requests and decodes responses, and never performs I/O.
//
// # Object maps
//
// Requests carry observed objects (children, attachments, outputs, related objects) as a two-level map.
// The outer key is "<Kind>.<apiVersion>" (for example "Pod.v1" or "StatefulSet.apps/v1"). The
// inner key depends on the hook version:
//
//   - v1 (upstream RelativeObjectMap, the default): the object's name, or "<namespace>/<name>"
//     when the parent is cluster-scoped and the object is namespaced. A namespaced parent only
//     ever sees objects of its own namespace, so the name alone is unambiguous there.
//   - v2 (upstream UniformObjectMap): "<namespace>/<name>" for every namespaced object and the
//     name for cluster-scoped ones, whatever the parent's scope.
//
// Every declared child or attachment type appears in the map even when nothing was observed,
// as {} rather than being left out, because hooks index into it without checking
// (children['Pod.v1'][name]). ObjectMap marshals a nil map, and nil inner maps, as {} for the
// same reason; in particular "related" is always {} when there is no customize hook, which is
// what the user guide promises ("the related section of the hooks will be empty").
//
// # Responses
//
// Hook responses are untrusted input. The lists of desired objects (ChildList, AttachmentList,
// OutputList) validate every entry while decoding: an entry that is not a JSON object, or lacks
// a non-empty string apiVersion, kind or metadata.name, fails the whole decode with an
// *ObjectError naming the list and the index. Because that validation lives in the list types' UnmarshalJSON, it
// applies whichever JSON decoder the caller uses; Decode is the recommended one (case-sensitive
// keys, integers kept as int64, optional strict mode), matching how upstream decodes.
package hookapi
