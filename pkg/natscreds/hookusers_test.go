package natscreds

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nkeys"
)

func TestHookUsersConf(t *testing.T) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	cases := []struct {
		reason string
		users  []HookUser
		// want are parts of the rendered entries, or of the error (err).
		want []string
		err  bool
	}{
		{reason: "no users: nothing", users: nil, want: []string{""}},
		{reason: "default subjects", users: []HookUser{{Name: "hello", NKey: pub}},
			want: []string{"nkey: " + pub, `subscribe: { allow: ["hooks.hello.>"] }`, `publish: { deny: [">"] }`, "allow_responses: true"}},
		{reason: "own subjects", users: []HookUser{{Name: "b", NKey: pub, Subjects: []string{"hooks.b.sync", "hooks.b.x.>"}}},
			want: []string{`subscribe: { allow: ["hooks.b.sync", "hooks.b.x.>"] }`}},
		{reason: "a subject of another hook", users: []HookUser{{Name: "b", NKey: pub, Subjects: []string{"hooks.c.sync"}}}, err: true,
			want: []string{`subject "hooks.c.sync" is not under hooks.b.`}},
		{reason: "the bus", users: []HookUser{{Name: "b", NKey: pub, Subjects: []string{"mc.>"}}}, err: true, want: []string{"is not under hooks.b."}},
		{reason: "the whole of its prefix only", users: []HookUser{{Name: "b", NKey: pub, Subjects: []string{"hooks.b."}}}, err: true, want: []string{"is not under"}},
		{reason: "a quote in a subject", users: []HookUser{{Name: "b", NKey: pub, Subjects: []string{`hooks.b."x`}}}, err: true, want: []string{"not a valid subject"}},
		{reason: "a bad name", users: []HookUser{{Name: "B_1", NKey: pub}}, err: true, want: []string{`hook user name "B_1"`}},
		{reason: "a seed instead of a public key", users: []HookUser{{Name: "b", NKey: "SUAbc"}}, err: true, want: []string{"is not a public user nkey"}},
		{reason: "no nkey: the one ensure generates, from the users Secret's variable", users: []HookUser{{Name: "team-b"}},
			want: []string{"nkey: $HOOK_TEAM_B_NKEY\n", `subscribe: { allow: ["hooks.team-b.>"] }`}},
		{reason: "twice", users: []HookUser{{Name: "b", NKey: pub}, {Name: "b", NKey: pub}}, err: true, want: []string{"listed twice"}},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			got, err := HookUsersConf(tc.users)
			if (err != nil) != tc.err {
				t.Fatalf("error %v, want error %v", err, tc.err)
			}
			if err != nil {
				got = err.Error()
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("%q lacks %q", got, w)
				}
			}
		})
	}
	if _, err := InsertHookUsers("users = [\n]\n", nil); err == nil {
		t.Error("a configuration without the marker was accepted")
	}
}

// TestHookUserIDs: a hook user's credentials user names the Secrets and
// the variable HookSecret and HookUsersConf name; bad names are refused.
func TestHookUserIDs(t *testing.T) {
	ids, err := HookUserIDs([]string{"hello", "team-b"})
	if err != nil {
		t.Fatal(err)
	}
	got := []string{ids[0], ids[1], SeedSecret(ids[1]), HookSecret("team-b"), UserKey(ids[1])}
	want := []string{"hook-hello", "hook-team-b", "metabus-nats-hook-team-b", "metabus-nats-hook-team-b", "HOOK_TEAM_B_NKEY"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ids, seed Secret, HookSecret, users key (-want +got):\n%s", diff)
	}
	for _, tc := range []struct {
		reason, want string
		names        []string
	}{
		{reason: "not a DNS label", names: []string{"Team_B"}, want: `hook user name "Team_B"`},
		{reason: "twice", names: []string{"a", "a"}, want: "listed twice"},
	} {
		if _, err := HookUserIDs(tc.names); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.reason, err, tc.want)
		}
	}
}

// TestEnsureHookUsers: ensure with hook users makes each one's seed Secret
// (HookSecret) and its public key in the users Secret, beside the services';
// an existing hook seed is kept and its key derived from it.
func TestEnsureHookUsers(t *testing.T) {
	ids, err := HookUserIDs([]string{"hello", "other"})
	if err != nil {
		t.Fatal(err)
	}
	users := append(append([]string(nil), Users...), ids...)
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	keptSeed, _ := kp.Seed()
	keptPub, _ := kp.PublicKey()
	have := map[string]Secret{HookSecret("other"): {Name: HookSecret("other"), Data: map[string][]byte{SeedKey: keptSeed}}}
	plan, err := Ensure(users, have, GenerateSeed)
	if err != nil {
		t.Fatal(err)
	}
	created := map[string]Secret{}
	for _, a := range plan {
		if a.Verb != Create {
			t.Errorf("unexpected %s", a)
		}
		created[a.Secret.Name] = a.Secret
	}
	if _, ok := created[HookSecret("other")]; ok {
		t.Error("the existing seed of hook other was replaced")
	}
	seed, ok := created[HookSecret("hello")]
	if !ok {
		t.Fatalf("no seed Secret for hook hello; plan %v", plan)
	}
	helloPub, err := PublicKey(seed.Data[SeedKey])
	if err != nil {
		t.Fatal(err)
	}
	pubs := created[UsersSecret].Data
	got := []string{string(pubs["HOOK_HELLO_NKEY"]), string(pubs["HOOK_OTHER_NKEY"])}
	if diff := cmp.Diff([]string{helloPub, keptPub}, got); diff != "" {
		t.Errorf("users Secret's hook keys (-want +got):\n%s", diff)
	}
	if len(pubs) != len(users) {
		t.Errorf("users Secret has %d keys, want one per user (%d)", len(pubs), len(users))
	}
}
