package natscreds

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nkeys"

	"github.com/metabus/metabus/pkg/natsx"
)

// keys is a fixed set of user seeds so that plans are comparable.
type keys struct {
	seeds [][]byte
	pubs  []string
}

func newKeys(t *testing.T, n int) keys {
	t.Helper()
	var k keys
	for range n {
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		seed, _ := kp.Seed()
		pub, _ := kp.PublicKey()
		k.seeds = append(k.seeds, seed)
		k.pubs = append(k.pubs, pub)
	}
	return k
}

// source hands out k's seeds in order and fails once they run out, so a
// plan that generates more seeds than it should is caught.
func (k keys) source() NewSeed {
	i := 0
	return func() ([]byte, error) {
		if i == len(k.seeds) {
			return nil, errors.New("no more seeds")
		}
		i++
		return k.seeds[i-1], nil
	}
}

var two = []string{"watcher", "applier"}

func seedSecret(svc string, seed []byte, rv string) Secret {
	return Secret{Name: SeedSecret(svc), Labels: map[string]string{natsx.CredentialsLabel: "true"}, Data: map[string][]byte{SeedKey: seed}, ResourceVersion: rv}
}

func usersSecret(rv string, kv ...string) Secret {
	data := map[string][]byte{}
	for i := 0; i < len(kv); i += 2 {
		data[kv[i]] = []byte(kv[i+1])
	}
	return Secret{Name: UsersSecret, Labels: map[string]string{natsx.CredentialsLabel: "true"}, Data: data, ResourceVersion: rv}
}

func haveOf(secrets ...Secret) map[string]Secret {
	m := map[string]Secret{}
	for _, s := range secrets {
		m[s.Name] = s
	}
	return m
}

// step is an Action without its message, for comparison.
type step struct {
	Verb   Verb
	Secret Secret
}

func steps(plan []Action) []step {
	var out []step
	for _, a := range plan {
		out = append(out, step{a.Verb, a.Secret})
	}
	return out
}

func TestEnsure(t *testing.T) {
	existing := newKeys(t, 2) // what a previous run made
	fresh := newKeys(t, 2)    // what this run may generate
	lbl := map[string]string{natsx.CredentialsLabel: "true"}
	tests := []struct {
		reason  string
		have    map[string]Secret
		want    []step
		wantErr string
	}{
		{
			reason: "fresh install: a seed per service, then the users Secret with their public keys",
			have:   haveOf(),
			want: []step{
				{Create, Secret{Name: "metabus-nats-watcher", Labels: lbl, Data: map[string][]byte{SeedKey: fresh.seeds[0]}}},
				{Create, Secret{Name: "metabus-nats-applier", Labels: lbl, Data: map[string][]byte{SeedKey: fresh.seeds[1]}}},
				{Create, usersSecret("", "WATCHER_NKEY", fresh.pubs[0], "APPLIER_NKEY", fresh.pubs[1])},
			},
		},
		{
			reason: "everything in place: no write (re-apply, upgrade, NATS restart)",
			have: haveOf(seedSecret("watcher", existing.seeds[0], "1"), seedSecret("applier", existing.seeds[1], "2"),
				usersSecret("3", "WATCHER_NKEY", existing.pubs[0], "APPLIER_NKEY", existing.pubs[1])),
		},
		{
			reason: "a previous run died after the seeds: the users Secret is made from them, no seed is replaced",
			have:   haveOf(seedSecret("watcher", existing.seeds[0], "1"), seedSecret("applier", existing.seeds[1], "2")),
			want:   []step{{Create, usersSecret("", "WATCHER_NKEY", existing.pubs[0], "APPLIER_NKEY", existing.pubs[1])}},
		},
		{
			reason: "a seed exists but the users Secret lacks its public key: derived from the seed",
			have: haveOf(seedSecret("watcher", existing.seeds[0], "1"), seedSecret("applier", existing.seeds[1], "2"),
				usersSecret("3", "WATCHER_NKEY", existing.pubs[0])),
			want: []step{{Update, usersSecret("3", "WATCHER_NKEY", existing.pubs[0], "APPLIER_NKEY", existing.pubs[1])}},
		},
		{
			reason: "a public key that does not match its seed (a rotation that died half way) follows the seed",
			have: haveOf(seedSecret("watcher", existing.seeds[0], "1"), seedSecret("applier", existing.seeds[1], "2"),
				usersSecret("3", "WATCHER_NKEY", existing.pubs[1], "APPLIER_NKEY", existing.pubs[1])),
			want: []step{{Update, usersSecret("3", "WATCHER_NKEY", existing.pubs[0], "APPLIER_NKEY", existing.pubs[1])}},
		},
		{
			reason: "one seed Secret missing: only that one is generated, the other kept",
			have: haveOf(seedSecret("watcher", existing.seeds[0], "1"),
				usersSecret("3", "WATCHER_NKEY", existing.pubs[0], "APPLIER_NKEY", existing.pubs[1])),
			want: []step{
				{Create, Secret{Name: "metabus-nats-applier", Labels: lbl, Data: map[string][]byte{SeedKey: fresh.seeds[0]}}},
				{Update, usersSecret("3", "WATCHER_NKEY", existing.pubs[0], "APPLIER_NKEY", fresh.pubs[0])},
			},
		},
		{
			reason: "hand-made Secrets (as the old README made them: no label, a newline after the seed): kept as they are",
			have: haveOf(
				Secret{Name: "metabus-nats-watcher", Data: map[string][]byte{SeedKey: append(slices.Clone(existing.seeds[0]), '\n')}, ResourceVersion: "1"},
				Secret{Name: "metabus-nats-applier", Data: map[string][]byte{SeedKey: existing.seeds[1]}, ResourceVersion: "2"},
				Secret{Name: UsersSecret, Data: map[string][]byte{"WATCHER_NKEY": []byte(existing.pubs[0]), "APPLIER_NKEY": []byte(existing.pubs[1])}, ResourceVersion: "3"}),
		},
		{
			reason: "other keys of the users Secret and its labels are kept on update",
			have: haveOf(seedSecret("watcher", existing.seeds[0], "1"), seedSecret("applier", existing.seeds[1], "2"),
				Secret{Name: UsersSecret, Labels: map[string]string{"team": "x"}, Data: map[string][]byte{"JETSTREAM_KEY": []byte("k")}, ResourceVersion: "3"}),
			want: []step{{Update, Secret{Name: UsersSecret, Labels: map[string]string{"team": "x"}, ResourceVersion: "3", Data: map[string][]byte{
				"JETSTREAM_KEY": []byte("k"), "WATCHER_NKEY": []byte(existing.pubs[0]), "APPLIER_NKEY": []byte(existing.pubs[1]),
			}}}},
		},
		{
			reason:  "a seed Secret without a usable seed is an error, never overwritten",
			have:    haveOf(Secret{Name: "metabus-nats-watcher", Data: map[string][]byte{"other": []byte("x")}, ResourceVersion: "1"}),
			wantErr: "metabus-nats-watcher exists but its nkey.seed is not an nkey user seed",
		},
		{
			reason:  "a seed of another kind (an account seed) is refused",
			have:    haveOf(Secret{Name: "metabus-nats-watcher", Data: map[string][]byte{SeedKey: accountSeed(t)}, ResourceVersion: "1"}),
			wantErr: "not of a user",
		},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			plan, err := Ensure(two, tt.have, fresh.source())
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, steps(plan)); diff != "" {
				t.Errorf("plan (-want +got):\n%s", diff)
			}
			for _, a := range plan {
				for _, s := range append(existing.seeds, fresh.seeds...) {
					if strings.Contains(a.String(), string(s)) {
						t.Errorf("%q reveals a seed", a.String())
					}
				}
			}
		})
	}
}

func accountSeed(t *testing.T) []byte {
	kp, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	return seed
}

// TestEnsureIsAFixpoint: applying a plan and planning again plans nothing,
// from any starting point of TestEnsure's kind.
func TestEnsureIsAFixpoint(t *testing.T) {
	existing := newKeys(t, 1)
	starts := map[string]map[string]Secret{
		"empty":        haveOf(),
		"one seed":     haveOf(seedSecret("applier", existing.seeds[0], "1")),
		"users only":   haveOf(usersSecret("1", "WATCHER_NKEY", "UABC")),
		"users, seeds": haveOf(seedSecret("watcher", existing.seeds[0], "1"), usersSecret("1", "WATCHER_NKEY", "UABC")),
	}
	for reason, have := range starts {
		t.Run(reason, func(t *testing.T) {
			plan, err := Ensure(two, have, GenerateSeed)
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range plan {
				a.Secret.ResourceVersion = "applied"
				have[a.Secret.Name] = a.Secret
			}
			again, err := Ensure(two, have, GenerateSeed)
			if err != nil || len(again) != 0 {
				t.Errorf("second plan %v, %v; want nothing", again, err)
			}
			for _, svc := range two {
				pub, err := PublicKey(have[SeedSecret(svc)].Data[SeedKey])
				if err != nil || string(have[UsersSecret].Data[UserKey(svc)]) != pub {
					t.Errorf("%s: users key %q, seed's %q (%v)", svc, have[UsersSecret].Data[UserKey(svc)], pub, err)
				}
			}
		})
	}
}

func TestRotateSeed(t *testing.T) {
	old := newKeys(t, 1)
	fresh := newKeys(t, 1)
	tests := []struct {
		reason  string
		svc     string
		have    map[string]Secret
		want    step
		wantErr string
	}{
		{
			reason: "an existing seed is replaced in place, other keys and labels kept",
			svc:    "watcher",
			have: haveOf(Secret{Name: "metabus-nats-watcher", Labels: map[string]string{"a": "b"},
				Data: map[string][]byte{SeedKey: old.seeds[0], "note": []byte("x")}, ResourceVersion: "7"}),
			want: step{Update, Secret{Name: "metabus-nats-watcher", Labels: map[string]string{"a": "b"},
				Data: map[string][]byte{SeedKey: fresh.seeds[0], "note": []byte("x")}, ResourceVersion: "7"}},
		},
		{
			reason: "a missing seed Secret is created",
			svc:    "applier",
			have:   haveOf(),
			want:   step{Create, seedSecret("applier", fresh.seeds[0], "")},
		},
		{
			reason:  "an unknown service is refused",
			svc:     "scheduler",
			wantErr: `unknown service "scheduler"; want one of watcher, applier`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			a, err := RotateSeed(two, tt.svc, tt.have, fresh.source())
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, step{a.Verb, a.Secret}); diff != "" {
				t.Errorf("action (-want +got):\n%s", diff)
			}
			if tt.have != nil {
				if s, ok := tt.have[SeedSecret(tt.svc)]; ok && string(s.Data[SeedKey]) != string(old.seeds[0]) {
					t.Error("RotateSeed changed the Secret it was given")
				}
			}
		})
	}
}

func TestNames(t *testing.T) {
	want := []string{"metabus-nats-watcher", "metabus-nats-dispatcher", "metabus-nats-applier", "metabus-nats-revisions", "metabus-nats-users"}
	if diff := cmp.Diff(want, Names(Services)); diff != "" {
		t.Errorf("names (-want +got):\n%s", diff)
	}
	for _, n := range want {
		if !strings.HasPrefix(n, natsx.CredentialsSecretPrefix) {
			t.Errorf("%s lacks the prefix the dispatcher refuses", n)
		}
	}
	// The operator users' Secrets too: nats-server.conf names their keys.
	all := []string{"metabus-nats-watcher", "metabus-nats-dispatcher", "metabus-nats-applier", "metabus-nats-revisions",
		"metabus-nats-operator", "metabus-nats-operator-admin", "metabus-nats-events", "metabus-nats-users"}
	if diff := cmp.Diff(all, Names(Users)); diff != "" {
		t.Errorf("names of every user (-want +got):\n%s", diff)
	}
	for user, key := range map[string]string{"watcher": "WATCHER_NKEY", "operator": "OPERATOR_NKEY", "operator-admin": "OPERATOR_ADMIN_NKEY", "events": "EVENTS_NKEY"} {
		if got := UserKey(user); got != key {
			t.Errorf("UserKey(%s) = %s, want %s (a shell and nats-server variable name)", user, got, key)
		}
	}
}
