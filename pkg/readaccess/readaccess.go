// Package readaccess decides what a controller's identity may read: the
// objects the watcher puts in the snapshots sent to the controller's hooks
// (parent, children, attachments, related objects, a MapController's
// inputs and outputs) are those its ServiceAccount may list and watch, as
// the API server's SubjectAccessReview answers.
//
// The decision is a pure function of cached answers (Decide, Next); Cache
// holds them, asks the reviews through a seam (Review), and re-asks each
// one within a bounded delay, so that a snapshot costs map lookups, never
// a review, once the answers are in.
package readaccess

import (
	"github.com/metabus/metabus/pkg/identity"
)

// Verdict is what is known of a scope's read access.
type Verdict uint8

const (
	// Unknown: not reviewed yet, or the review failed. Nothing of an
	// unknown scope may be sent: the caller waits or retries.
	Unknown Verdict = iota
	// Allowed: the identity may list and watch.
	Allowed
	// Denied: the identity may not list, or may not watch.
	Denied
)

func (v Verdict) String() string {
	switch v {
	case Allowed:
		return "allowed"
	case Denied:
		return "denied"
	default:
		return "unknown"
	}
}

// Verbs are the verbs a scope's objects need: the watcher lists and
// watches on the identity's behalf, so both must be allowed (a Role that
// grants only get does not make a watch stream the identity's to read).
var Verbs = []string{"list", "watch"}

// Scope is one question: may Identity read Resource of Group in
// Namespace. Namespace "" asks about every namespace at once (for a
// cluster-scoped resource, about the resource).
type Scope struct {
	Identity  identity.Identity
	Group     string
	Resource  string
	Namespace string
}

// Cluster is s asked about every namespace.
func (s Scope) Cluster() Scope {
	s.Namespace = ""
	return s
}

// String names the scope for messages: "<resource>.<group> in namespace
// <ns>" or "<resource>.<group> in every namespace".
func (s Scope) String() string {
	res := s.Resource
	if s.Group != "" {
		res += "." + s.Group
	}
	if s.Namespace == "" {
		return res + " (cluster-wide)"
	}
	return res + " in namespace " + s.Namespace
}

// Lookup returns the cached verdict of exactly s (Unknown if none).
type Lookup func(s Scope) Verdict

// Decide is the verdict on reading objects of s: allowed cluster-wide
// covers every namespace; otherwise a namespace's own answer decides. A
// cluster-wide denial says nothing of a namespace, whose own review
// (Next) must be asked.
func Decide(lookup Lookup, s Scope) Verdict {
	cluster := lookup(s.Cluster())
	if cluster == Allowed || s.Namespace == "" {
		return cluster
	}
	if cluster == Unknown {
		return Unknown
	}
	return lookup(s)
}

// Next is the review that would decide s, and false when s is decided
// already (or for a namespace scope whose cluster-wide review is still
// out: that one first, since it may answer every namespace at once).
func Next(lookup Lookup, s Scope) (Scope, bool) {
	cluster := lookup(s.Cluster())
	switch {
	case cluster == Unknown:
		return s.Cluster(), true
	case cluster == Allowed || s.Namespace == "":
		return Scope{}, false
	case lookup(s) == Unknown:
		return s, true
	default:
		return Scope{}, false
	}
}

// Combine is the verdict of a scope from the answers of each of Verbs:
// allowed only if every verb is, denied if any is.
func Combine(verdicts ...Verdict) Verdict {
	out := Allowed
	for _, v := range verdicts {
		switch v {
		case Denied:
			return Denied
		case Unknown:
			out = Unknown
		}
	}
	if len(verdicts) == 0 {
		return Unknown
	}
	return out
}
