package identity

import (
	"flag"
	"io"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestOf(t *testing.T) {
	def := Identity{Namespace: "metabus", Name: "nobody"}
	for _, c := range []struct {
		reason      string
		annotations map[string]string
		def         Identity
		want        Identity
		wantErr     bool
	}{
		{reason: "no annotation, no default: the services' own authority (upstream)", want: Identity{}},
		{reason: "no annotation: the operator's default", def: def, want: def},
		{reason: "the annotation names an account", annotations: map[string]string{ServiceAccountAnnotation: "team-a/deployer"}, def: def,
			want: Identity{Namespace: "team-a", Name: "deployer"}},
		{reason: "surrounding space is ignored", annotations: map[string]string{ServiceAccountAnnotation: " team-a/deployer "},
			want: Identity{Namespace: "team-a", Name: "deployer"}},
		{reason: "an empty annotation is the default", annotations: map[string]string{ServiceAccountAnnotation: ""}, def: def, want: def},
		{reason: "no namespace is refused", annotations: map[string]string{ServiceAccountAnnotation: "deployer"}, def: def, wantErr: true},
		{reason: "a user name is refused, never passed through", annotations: map[string]string{ServiceAccountAnnotation: "system:serviceaccount:kube-system:admin"}, wantErr: true},
		{reason: "an extra segment is refused", annotations: map[string]string{ServiceAccountAnnotation: "a/b/c"}, wantErr: true},
		{reason: "a namespace that is not a DNS label is refused", annotations: map[string]string{ServiceAccountAnnotation: "Team_A/deployer"}, wantErr: true},
		{reason: "a name with a colon is refused", annotations: map[string]string{ServiceAccountAnnotation: "team-a/x:y"}, wantErr: true},
	} {
		t.Run(c.reason, func(t *testing.T) {
			got, err := Of(c.annotations, c.def)
			if (err != nil) != c.wantErr {
				t.Fatalf("Of error = %v, want error %v", err, c.wantErr)
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("Of (-want +got):\n%s", diff)
			}
		})
	}
}

func TestIdentityNames(t *testing.T) {
	id := Identity{Namespace: "team-a", Name: "deployer"}
	got := []any{id.String(), id.Username(), id.Groups(), Identity{}.Username(), Identity{}.None()}
	want := []any{"team-a/deployer", "system:serviceaccount:team-a:deployer",
		[]string{"system:serviceaccounts", "system:serviceaccounts:team-a", "system:authenticated"}, "", true}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("names (-want +got):\n%s", diff)
	}
}

func TestRegisterDefaultFlag(t *testing.T) {
	for _, c := range []struct {
		reason  string
		args    []string
		want    []Identity
		wantErr bool
	}{
		{reason: "unset: none for every stage (upstream)", want: []Identity{{}, {}}},
		{reason: "one value sets every stage registered in the flag set (the all-in-one)",
			args: []string{"--default-service-account=metabus/nobody"}, want: []Identity{{Namespace: "metabus", Name: "nobody"}, {Namespace: "metabus", Name: "nobody"}}},
		{reason: "a value that is not <namespace>/<name> is refused", args: []string{"--default-service-account=nobody"}, wantErr: true},
	} {
		t.Run(c.reason, func(t *testing.T) {
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			got := make([]Identity, 2)
			RegisterDefaultFlag(fs, &got[0])
			RegisterDefaultFlag(fs, &got[1])
			err := fs.Parse(c.args)
			if (err != nil) != c.wantErr {
				t.Fatalf("Parse error = %v, want error %v", err, c.wantErr)
			}
			if c.wantErr {
				return
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("identities (-want +got):\n%s", diff)
			}
		})
	}
}
