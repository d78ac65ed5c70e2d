package mapctl

import (
	"crypto/sha256"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Names of the tag metabus puts on every output.
const (
	// MapKeyLabel holds the map key of the input an output was made from.
	// A label, not an annotation, so the watcher can index and select
	// outputs by key.
	MapKeyLabel = "metacontroller.k8s.io/map-key"
	// InputAnnotation names that input (InputRef.Annotation), for people
	// reading the output and for the tombstone hook, which is never sent
	// the input itself.
	InputAnnotation = "metacontroller.k8s.io/map-input"
)

// KeyLength is the length of every map key.
const KeyLength = 52

// keyEncoding is RFC 4648 base32 in lower case without padding: only
// [a-z2-7], so a key is a valid label value (alphanumeric, at most 63
// characters) and a NATS subject token (no '.', '*', '>' or space) as it
// is, with no second encoding to keep in sync.
var keyEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// InputRef identifies one input object. The version is left out: the same
// object read through another version of its API is the same input, and
// a map key must not change when an input resource's declared apiVersion
// does.
type InputRef struct {
	Group     string // "" for the core group
	Kind      string
	Namespace string // "" for a cluster-scoped input
	Name      string
	UID       string
}

// InputRefOf identifies input, an object of the resource whose apiVersion
// and kind are given (from the spec and discovery, not the object: cache
// objects may lack their type).
func InputRefOf(apiVersion, kind string, input *unstructured.Unstructured) (InputRef, error) {
	if input == nil {
		return InputRef{}, errors.New("no input object")
	}
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		return InputRef{}, fmt.Errorf("input %s: apiVersion: %w", input.GetName(), err)
	}
	ref := InputRef{Group: gv.Group, Kind: kind, Namespace: input.GetNamespace(), Name: input.GetName(), UID: string(input.GetUID())}
	if ref.Kind == "" || ref.Name == "" || ref.UID == "" {
		// Without the UID a recreated input would inherit the outputs
		// (and the tombstone decision) of the one it replaced.
		return InputRef{}, fmt.Errorf("input %q of kind %q: a map key needs kind, name and UID", ref.Name, ref.Kind)
	}
	return ref, nil
}

// Key is the input's map key: the SHA-256 of the JSON array [group, kind,
// namespace, name, uid] as encoding/json writes it (no spaces), in
// keyEncoding, always KeyLength characters.
//
// The UID is part of it, so a recreated input with the same name is a new
// input: the old one's outputs become detached (tombstone hook) and the
// new one starts with none. A hash rather than the readable identity
// because names and namespaces together exceed what a label value allows
// (63 characters) and contain '.', which a subject token cannot; the
// readable identity travels in InputAnnotation. The JSON array keeps the
// fields apart unambiguously (no separator can be forged by a name). This
// encoding is frozen: changing it would detach every existing output.
func (r InputRef) Key() string {
	data, err := json.Marshal([]string{r.Group, r.Kind, r.Namespace, r.Name, r.UID})
	if err != nil {
		// A []string always marshals; keep the key total anyway.
		data = []byte(strings.Join([]string{r.Group, r.Kind, r.Namespace, r.Name, r.UID}, "\x00"))
	}
	sum := sha256.Sum256(data)
	return keyEncoding.EncodeToString(sum[:])
}

// Annotation is the value of InputAnnotation: group/kind/namespace/name/uid,
// with empty segments for the core group and a cluster-scoped input (e.g.
// "/PersistentVolumeClaim/ns/data-0/<uid>"). None of the five can contain
// '/', so the value splits back unambiguously (ParseInputAnnotation).
func (r InputRef) Annotation() string {
	return strings.Join([]string{r.Group, r.Kind, r.Namespace, r.Name, r.UID}, "/")
}

// ParseInputAnnotation reads an InputAnnotation value back.
func ParseInputAnnotation(v string) (InputRef, error) {
	parts := strings.Split(v, "/")
	if len(parts) != 5 {
		return InputRef{}, fmt.Errorf("%s %q: want group/kind/namespace/name/uid", InputAnnotation, v)
	}
	ref := InputRef{Group: parts[0], Kind: parts[1], Namespace: parts[2], Name: parts[3], UID: parts[4]}
	if ref.Kind == "" || ref.Name == "" || ref.UID == "" {
		return InputRef{}, fmt.Errorf("%s %q: kind, name and uid are required", InputAnnotation, v)
	}
	return ref, nil
}

// ValidKey reports whether s has the form of a map key. Anything else in
// MapKeyLabel (a hand edit) belongs to no input.
func ValidKey(s string) bool {
	if len(s) != KeyLength {
		return false
	}
	for _, c := range []byte(s) {
		if (c < 'a' || c > 'z') && (c < '2' || c > '7') {
			return false
		}
	}
	return true
}

// KeyOf returns the map key an output is tagged with, and false when it
// has none or not a well-formed one.
func KeyOf(output *unstructured.Unstructured) (string, bool) {
	if output == nil {
		return "", false
	}
	k := output.GetLabels()[MapKeyLabel]
	return k, ValidKey(k)
}
