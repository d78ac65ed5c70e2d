package revision

import (
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"maps"
	"math"
	"strings"
	"testing"
)

func TestName(t *testing.T) {
	sum := func(s string) string { h := sha1.Sum([]byte(s)); return hex.EncodeToString(h[:]) }
	long := strings.Repeat("r", 300)
	dotAt212 := strings.Repeat("r", 211) // "rrr…r." + group: the cut lands right after the dot
	cases := []struct {
		reason          string
		resource, group string
		uid             string
		patch           map[string]any
		want            string // exact name, or "" when only wantLen/wantPrefix are checked
		wantPrefix      string
		wantLen         int
		wantErr         string
	}{
		{reason: "upstream layout: resource.group-sha1(uid + canonical JSON)",
			resource: "catsets", group: "ctl.enisoc.com", uid: "uid-1",
			patch: map[string]any{"spec": map[string]any{"template": map[string]any{"b": "x", "a": int64(1)}}},
			want:  "catsets.ctl.enisoc.com-" + sum(`uid-1{"spec":{"template":{"a":1,"b":"x"}}}`)},
		{reason: "the core group is spelled core",
			resource: "configmaps", uid: "u", patch: map[string]any{},
			want: "configmaps.core-" + sum(`u{}`)},
		{reason: "a nil patch is the empty object",
			resource: "configmaps", uid: "u", patch: nil,
			want: "configmaps.core-" + sum(`u{}`)},
		{reason: "numbers hash the same whether int64, float64 or json.Number",
			resource: "catsets", group: "g", uid: "u",
			patch: map[string]any{"n": json.Number("3.0"), "m": float64(2), "k": json.Number("7")},
			want:  "catsets.g-" + sum(`u{"k":7,"m":2,"n":3}`)},
		{reason: "an over-long prefix is cut to 212 characters, keeping the name at 253",
			resource: long, group: "g", uid: "u", patch: map[string]any{},
			wantPrefix: strings.Repeat("r", MaxPrefixLength) + "-", wantLen: MaxNameLength},
		{reason: "a cut that ends in '.' drops it, so the name stays a DNS subdomain",
			resource: dotAt212, group: "example.com", uid: "u", patch: map[string]any{},
			wantPrefix: dotAt212 + "-", wantLen: 211 + 1 + 40},
		{reason: "an empty resource is an error", resource: "", wantErr: "empty parent resource"},
		{reason: "an unencodable patch is an error", resource: "x", patch: map[string]any{"f": math.NaN()},
			wantErr: "encode parent patch"},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			got, err := Name(tc.resource, tc.group, tc.uid, tc.patch)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.want != "" && got != tc.want {
				t.Fatalf("got %s, want %s", got, tc.want)
			}
			if tc.wantPrefix != "" && (!strings.HasPrefix(got, tc.wantPrefix) || len(got) != tc.wantLen) {
				t.Fatalf("got %s (len %d), want prefix %s and len %d", got, len(got), tc.wantPrefix, tc.wantLen)
			}
			if len(got) > MaxNameLength {
				t.Fatalf("name longer than %d: %d", MaxNameLength, len(got))
			}
			again, _ := Name(tc.resource, tc.group, tc.uid, tc.patch)
			if again != got {
				t.Fatalf("not deterministic: %s then %s", got, again)
			}
		})
	}
}

func TestNameDistinguishes(t *testing.T) {
	base, _ := Name("catsets", "g", "uid-1", map[string]any{"spec": "a"})
	for _, tc := range []struct {
		reason              string
		resource, group, id string
		patch               map[string]any
	}{
		{"another parent UID", "catsets", "g", "uid-2", map[string]any{"spec": "a"}},
		{"another patch", "catsets", "g", "uid-1", map[string]any{"spec": "b"}},
		{"another group", "catsets", "h", "uid-1", map[string]any{"spec": "a"}},
	} {
		if got, _ := Name(tc.resource, tc.group, tc.id, tc.patch); got == base {
			t.Errorf("%s: same name %s", tc.reason, got)
		}
	}
}

func TestLabels(t *testing.T) {
	template := map[string]string{"app": "nginx", "component": "backend"}
	cases := []struct {
		reason   string
		template map[string]string
		uid      string
		want     map[string]string
	}{
		{reason: "template labels plus group and resource",
			template: template,
			want: map[string]string{"app": "nginx", "component": "backend",
				LabelAPIGroup: "ctl.enisoc.com", LabelResource: "catsets"}},
		{reason: "generateSelector: controller-uid instead of the template labels",
			template: template, uid: "uid-1",
			want: map[string]string{"controller-uid": "uid-1", LabelAPIGroup: "ctl.enisoc.com", LabelResource: "catsets"}},
		{reason: "no template labels",
			want: map[string]string{LabelAPIGroup: "ctl.enisoc.com", LabelResource: "catsets"}},
		{reason: "our labels win over template labels of the same key",
			template: map[string]string{LabelResource: "forged"},
			want:     map[string]string{LabelAPIGroup: "ctl.enisoc.com", LabelResource: "catsets"}},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			before := maps.Clone(tc.template)
			got := Labels(tc.template, tc.uid, "ctl.enisoc.com", "catsets")
			if !maps.Equal(got, tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			if !maps.Equal(tc.template, before) {
				t.Fatalf("template labels modified")
			}
		})
	}
}
