package applier

import (
	"errors"
	"flag"
	"io"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/client-go/rest"

	ctlid "github.com/metabus/metabus/pkg/identity"
)

// TestIdentityClients checks the per-identity cache: one build per
// identity, each impersonating its account (the user only: the API server
// adds a ServiceAccount's groups), the least
// recently used evicted when full, the idle ones dropped.
func TestIdentityClients(t *testing.T) {
	a := ctlid.Identity{Namespace: "team-a", Name: "deployer"}
	b := ctlid.Identity{Namespace: "team-b", Name: "deployer"}
	c := ctlid.Identity{Namespace: "team-c", Name: "deployer"}
	type step struct {
		id      ctlid.Identity
		advance time.Duration
	}
	for _, tc := range []struct {
		reason    string
		max       int
		steps     []step
		wantBuilt []string // the impersonated user of each build, in order
		wantLen   int
	}{
		{reason: "an identity is built once and reused", max: 4,
			steps:     []step{{id: a}, {id: a}, {id: b}, {id: a}},
			wantBuilt: []string{a.Username(), b.Username()}, wantLen: 2},
		{reason: "when full, the least recently used goes first", max: 2,
			steps:     []step{{id: a}, {id: b}, {id: a}, {id: c}, {id: a}, {id: b}},
			wantBuilt: []string{a.Username(), b.Username(), c.Username(), b.Username()}, wantLen: 2},
		{reason: "an identity unused for the idle time is built again", max: 4,
			steps:     []step{{id: a}, {id: b, advance: time.Hour}, {id: a}},
			wantBuilt: []string{a.Username(), b.Username(), a.Username()}, wantLen: 2},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			now := time.Unix(0, 0)
			var built []string
			base := &rest.Config{Host: "https://example.invalid"}
			cache := newIdentityClients(base, func(cfg *rest.Config) (writers, error) {
				built = append(built, cfg.Impersonate.UserName)
				if _, err := userIdentity(cfg.Impersonate.UserName); err != nil {
					return writers{}, err
				}
				if cfg.Impersonate.Groups != nil || cfg.Impersonate.UID != "" {
					t.Errorf("impersonation of %s names more than the user: %+v", cfg.Impersonate.UserName, cfg.Impersonate)
				}
				return writers{}, nil
			})
			cache.max, cache.idle, cache.now = tc.max, 30*time.Minute, func() time.Time { return now }
			for _, s := range tc.steps {
				now = now.Add(s.advance + time.Second)
				if _, err := cache.get(s.id); err != nil {
					t.Fatal(err)
				}
			}
			if diff := cmp.Diff(tc.wantBuilt, built); diff != "" {
				t.Errorf("builds (-want +got):\n%s", diff)
			}
			if got := cache.len(); got != tc.wantLen {
				t.Errorf("cached identities = %d, want %d", got, tc.wantLen)
			}
			if base.Impersonate.UserName != "" {
				t.Errorf("the base config was changed: %+v", base.Impersonate)
			}
		})
	}
}

// userIdentity reads a ServiceAccount's user name back (the test's check
// that the groups match the user).
func userIdentity(user string) (ctlid.Identity, error) {
	for _, id := range []ctlid.Identity{{Namespace: "team-a", Name: "deployer"}, {Namespace: "team-b", Name: "deployer"}, {Namespace: "team-c", Name: "deployer"}} {
		if id.Username() == user {
			return id, nil
		}
	}
	return ctlid.Identity{}, errors.New("unexpected user " + user)
}

// TestIdentityClientsBuildError checks that a failed build is an error,
// not cached.
func TestIdentityClientsBuildError(t *testing.T) {
	calls := 0
	cache := newIdentityClients(&rest.Config{}, func(*rest.Config) (writers, error) {
		calls++
		return writers{}, errors.New("no transport")
	})
	id := ctlid.Identity{Namespace: "team-a", Name: "deployer"}
	for i := 0; i < 2; i++ {
		if _, err := cache.get(id); err == nil {
			t.Fatal("get succeeded with a failing build")
		}
	}
	if calls != 2 || cache.len() != 0 {
		t.Errorf("builds = %d, cached = %d; want 2 and 0", calls, cache.len())
	}
}

// TestResolveIdentity checks which identity, and which clients, a
// controller's writes get.
func TestResolveIdentity(t *testing.T) {
	def := ctlid.Identity{Namespace: "metabus", Name: "metabus-nobody"}
	named := ctlid.Identity{Namespace: "team-a", Name: "deployer"}
	for _, tc := range []struct {
		reason      string
		def         ctlid.Identity
		annotations map[string]string
		want        ctlid.Identity
		wantOwn     bool
		wantErr     bool
	}{
		{reason: "no annotation, no default: the applier's own clients (upstream)", wantOwn: true},
		{reason: "no annotation: the default account", def: def, want: def},
		{reason: "the annotation wins over the default", def: def,
			annotations: map[string]string{ctlid.ServiceAccountAnnotation: "team-a/deployer"}, want: named},
		{reason: "an annotation without default is still impersonated",
			annotations: map[string]string{ctlid.ServiceAccountAnnotation: "team-a/deployer"}, want: named},
		{reason: "an invalid annotation is refused, never the default nor the applier", def: def,
			annotations: map[string]string{ctlid.ServiceAccountAnnotation: "system:masters"}, wantErr: true},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			var built []string
			a := &Applier{cfg: Config{DefaultServiceAccount: tc.def}}
			a.identities = newIdentityClients(&rest.Config{}, func(cfg *rest.Config) (writers, error) {
				built = append(built, cfg.Impersonate.UserName)
				return writers{raw: &rawClient{}}, nil
			})
			id, w, err := a.resolveIdentity(tc.annotations)
			if (err != nil) != tc.wantErr {
				t.Fatalf("error = %v, want error %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, id); diff != "" {
				t.Errorf("identity (-want +got):\n%s", diff)
			}
			if own := w.raw == nil; own != (tc.wantOwn || tc.wantErr) {
				t.Errorf("own clients = %v, want %v", own, tc.wantOwn)
			}
			var wantBuilt []string
			if !tc.want.None() {
				wantBuilt = []string{tc.want.Username()}
			}
			if diff := cmp.Diff(wantBuilt, built); diff != "" {
				t.Errorf("impersonated (-want +got):\n%s", diff)
			}
		})
	}
}

// TestDefaultServiceAccountFlag checks the flag's parsing.
func TestDefaultServiceAccountFlag(t *testing.T) {
	for _, tc := range []struct {
		reason  string
		args    []string
		want    ctlid.Identity
		wantErr bool
	}{
		{reason: "unset: none (upstream)"},
		{reason: "an account", args: []string{"--default-service-account=metabus/metabus-nobody"}, want: ctlid.Identity{Namespace: "metabus", Name: "metabus-nobody"}},
		{reason: "a user name is refused", args: []string{"--default-service-account=system:admin"}, wantErr: true},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			var cfg Config
			fs := flag.NewFlagSet("applier", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			cfg.RegisterFlags(fs)
			err := fs.Parse(tc.args)
			if (err != nil) != tc.wantErr {
				t.Fatalf("parse error = %v, want error %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, cfg.DefaultServiceAccount); diff != "" {
				t.Errorf("DefaultServiceAccount (-want +got):\n%s", diff)
			}
		})
	}
}
