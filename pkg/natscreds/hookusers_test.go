package natscreds

import (
	"strings"
	"testing"

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
