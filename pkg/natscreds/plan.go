// Package natscreds creates and keeps metabus's per-service NATS
// credentials as Kubernetes Secrets, so that an install needs nothing made
// by hand.
//
// Each service (watcher, dispatcher, applier, revisions) authenticates to
// NATS as its own nkey user: its seed lives in the Secret
// metabus-nats-<service> (key nkey.seed, mounted into that service only),
// and nats-server reads the matching public keys from the Secret
// metabus-nats-users (keys WATCHER_NKEY, ... passed to it as environment
// variables; see deploy/nats/nats-server.conf).
//
// The seeds are the source of truth: the public keys are derived from them.
// Ensure creates what is missing and never replaces a seed, so running it
// again, on every NATS start or upgrade, changes nothing; a run that died
// half way (a seed created, the users Secret not yet written) is completed
// by the next one. Rotate replaces one service's seed on purpose.
//
// The NATS TLS material is made the same way (EnsureTLS, RunTLS): a CA in
// metabus-nats-ca, and certificates signed by it for the server
// (metabus-nats-server-tls) and each user (metabus-nats-<user>-tls),
// created when missing and never replaced, so that TLS needs no hand step
// and no template generates key material. Every Secret this package writes
// is labelled natsx.CredentialsLabel.
//
// The planning (Ensure, RotateSeed, EnsureTLS) is pure but for the
// randomness of new keys: given the Secrets that exist,
// which to create or update. Run, RunTLS and RunRotate do the I/O against
// the API server.
package natscreds

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/nats-io/nkeys"

	"github.com/metabus/metabus/pkg/natsx"
)

// SeedKey is the key of a seed Secret that holds the service's nkey seed
// (the file the service reads with --nats-nkey).
const SeedKey = "nkey.seed"

// UsersSecret names the Secret with every service's public key, read by
// nats-server.
const UsersSecret = natsx.CredentialsSecretPrefix + "users"

// Services are the NATS users metabus runs, one per service.
var Services = []string{"watcher", "dispatcher", "applier", "revisions"}

// Operators are the NATS users of people (the metabus operator CLI and the
// nats CLI): operator reads, operator-admin also replays and purges the
// DLQ. No pod mounts their seeds; an operator copies one out of its Secret.
var Operators = []string{"operator", "operator-admin"}

// Consumers are the NATS users of other systems: events reads the bus's
// events for consumers (stream MC_EVENTS, subjects metabus.events.>) and
// nothing else. No pod mounts its seed; its owner copies it out.
var Consumers = []string{"events"}

// Users are every nkey user nats-server.conf names, services, operators,
// then consumers; the order is the order their Secrets are written in. All of
// them must have a public key in UsersSecret: nats-server refuses a
// configuration with an undefined variable.
var Users = append(append(append([]string(nil), Services...), Operators...), Consumers...)

// SeedSecret names the Secret holding svc's nkey seed.
func SeedSecret(svc string) string { return natsx.CredentialsSecretPrefix + svc }

// UserKey is the key of svc's public key in UsersSecret, also the
// environment variable nats-server.conf reads it from ($WATCHER_NKEY, ...,
// $OPERATOR_ADMIN_NKEY).
func UserKey(svc string) string { return strings.ToUpper(strings.ReplaceAll(svc, "-", "_")) + "_NKEY" }

// Names lists every Secret the credentials of services live in.
func Names(services []string) []string {
	out := make([]string, 0, len(services)+1)
	for _, svc := range services {
		out = append(out, SeedSecret(svc))
	}
	return append(out, UsersSecret)
}

// Secret is the part of a Kubernetes Secret the planning reads and writes.
type Secret struct {
	Name   string
	Labels map[string]string
	Data   map[string][]byte
	// Type is the Secret's type; empty means Opaque.
	Type string
	// ResourceVersion of an existing Secret; an update carries it so that
	// the API server refuses it if someone else wrote in between.
	ResourceVersion string
}

// Verb is what an Action does.
type Verb string

const (
	Create Verb = "create"
	Update Verb = "update"
)

// Action is one write: the whole Secret as it must be after it.
type Action struct {
	Verb   Verb
	Secret Secret
	// Why says what the write does, for the log (never a seed).
	Why string
}

// String describes the action without any secret material.
func (a Action) String() string { return fmt.Sprintf("%s Secret %s: %s", a.Verb, a.Secret.Name, a.Why) }

// NewSeed returns a fresh nkey user seed.
type NewSeed func() ([]byte, error)

// GenerateSeed is the NewSeed of production: a new random nkey user.
func GenerateSeed() ([]byte, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, fmt.Errorf("generate an nkey user: %w", err)
	}
	return kp.Seed()
}

// PublicKey returns the public key of a user seed, or why it is not one.
// Surrounding white space is ignored: a seed file written by `nk -gen user`
// (as deploy/README.md once said to) ends with a newline, and the services
// read such files fine.
func PublicKey(seed []byte) (string, error) {
	seed = bytes.TrimSpace(seed)
	prefix, _, err := nkeys.DecodeSeed(seed)
	if err != nil {
		return "", err
	}
	if prefix != nkeys.PrefixByteUser {
		return "", fmt.Errorf("a seed of kind %s, not of a user", prefix)
	}
	kp, err := nkeys.FromSeed(seed)
	if err != nil {
		return "", err
	}
	return kp.PublicKey()
}

// labels are those of every Secret the generator creates.
func labels() map[string]string { return map[string]string{natsx.CredentialsLabel: "true"} }

// Ensure plans the writes that make the credentials of services complete:
// a seed Secret for each service that has none, then the users Secret with
// each seed's public key (created, or updated where a key is missing or
// does not match the seed). Existing seeds are never replaced; a seed
// Secret whose seed is unreadable is an error, left for an admin (Rotate
// replaces it). have holds the Secrets that exist, by name. No writes means
// everything is in place.
func Ensure(services []string, have map[string]Secret, newSeed NewSeed) ([]Action, error) {
	var plan []Action
	pubs := map[string]string{}
	for _, svc := range services {
		name := SeedSecret(svc)
		s, ok := have[name]
		if !ok {
			seed, err := newSeed()
			if err != nil {
				return nil, err
			}
			pub, err := PublicKey(seed)
			if err != nil {
				return nil, fmt.Errorf("new seed of %s: %w", svc, err)
			}
			pubs[svc] = pub
			plan = append(plan, Action{Verb: Create, Secret: Secret{Name: name, Labels: labels(), Data: map[string][]byte{SeedKey: seed}},
				Why: fmt.Sprintf("new nkey seed of the %s (public key %s)", svc, pub)})
			continue
		}
		pub, err := PublicKey(s.Data[SeedKey])
		if err != nil {
			return nil, fmt.Errorf("the Secret %s exists but its %s is not an nkey user seed (%v); it is left as it is: "+
				"replace it with `metabus credentials rotate --service %s`, or delete it and run `metabus credentials ensure`",
				name, SeedKey, err, svc)
		}
		pubs[svc] = pub
	}
	if a, ok := users(services, have, pubs); ok {
		plan = append(plan, a)
	}
	return plan, nil
}

// users plans the write of the users Secret that makes it hold pubs, if any
// is needed. Keys other than the services' are kept.
func users(services []string, have map[string]Secret, pubs map[string]string) (Action, bool) {
	cur, exists := have[UsersSecret]
	if !exists {
		data := map[string][]byte{}
		for _, svc := range services {
			data[UserKey(svc)] = []byte(pubs[svc])
		}
		return Action{Verb: Create, Secret: Secret{Name: UsersSecret, Labels: labels(), Data: data},
			Why: "public keys of " + strings.Join(services, ", ")}, true
	}
	data := maps.Clone(cur.Data)
	if data == nil {
		data = map[string][]byte{}
	}
	var changed []string
	for _, svc := range services {
		k := UserKey(svc)
		if string(data[k]) == pubs[svc] {
			continue
		}
		what := "added"
		if _, had := data[k]; had {
			what = "replaced (it did not match the seed)"
		}
		data[k] = []byte(pubs[svc])
		changed = append(changed, fmt.Sprintf("%s %s", k, what))
	}
	if len(changed) == 0 {
		return Action{}, false
	}
	s := cur
	s.Data = data
	s.Labels = maps.Clone(cur.Labels)
	return Action{Verb: Update, Secret: s, Why: "public key " + strings.Join(changed, ", ")}, true
}

// RotateSeed plans the write that gives svc a new seed: an update of its
// seed Secret (other keys and labels kept), or its creation if it is
// missing. The users Secret follows with Ensure, which derives the new
// public key from the new seed.
func RotateSeed(services []string, svc string, have map[string]Secret, newSeed NewSeed) (Action, error) {
	if !slices.Contains(services, svc) {
		return Action{}, fmt.Errorf("unknown service %q; want one of %s", svc, strings.Join(services, ", "))
	}
	seed, err := newSeed()
	if err != nil {
		return Action{}, err
	}
	pub, err := PublicKey(seed)
	if err != nil {
		return Action{}, fmt.Errorf("new seed of %s: %w", svc, err)
	}
	name := SeedSecret(svc)
	why := fmt.Sprintf("new nkey seed of the %s (public key %s)", svc, pub)
	cur, ok := have[name]
	if !ok {
		return Action{Verb: Create, Secret: Secret{Name: name, Labels: labels(), Data: map[string][]byte{SeedKey: seed}}, Why: why}, nil
	}
	s := cur
	s.Data = maps.Clone(cur.Data)
	if s.Data == nil {
		s.Data = map[string][]byte{}
	}
	s.Data[SeedKey] = seed
	s.Labels = maps.Clone(cur.Labels)
	return Action{Verb: Update, Secret: s, Why: why}, nil
}
