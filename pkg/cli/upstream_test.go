package cli

import "testing"

// TestSameAsUpstreamDefault: a default is compared with upstream's as
// upstream's type, so a flag set's spelling of the same value (30m0s for
// 30m) is not taken for a difference, and a real one is.
func TestSameAsUpstreamDefault(t *testing.T) {
	cases := []struct {
		reason  string
		name    string
		value   string
		want    bool
		wantErr bool
	}{
		{reason: "a duration printed by Go's flag package is upstream's 30m", name: "cache-flush-interval", value: "30m0s", want: true},
		{reason: "another duration differs", name: "cache-flush-interval", value: "10m0s", want: false},
		{reason: "a rate printed in full is upstream's 1/300", name: "events-qps", value: "0.0033333333333333335", want: true},
		{reason: "metabus's unlimited client rate differs from upstream's 5", name: "client-go-qps", value: "-1", want: false},
		{reason: "an int compares as an int", name: "workers", value: "5", want: true},
		{reason: "metabus's 16 workers differ", name: "workers", value: "16", want: false},
		{reason: "a bool compares as a bool", name: "leader-election", value: "false", want: true},
		{reason: "a string compares exactly", name: "leader-election-id", value: "metabus-watcher", want: false},
		{reason: "an empty string default is upstream's empty one", name: "zap-time-encoding", value: "", want: true},
		{reason: "a value that does not parse as upstream's type is an error", name: "workers", value: "many", wantErr: true},
		{reason: "a flag upstream does not have is an error", name: "nats-url", value: "nats://127.0.0.1:4222", wantErr: true},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			got, err := SameAsUpstreamDefault(c.name, c.value)
			if (err != nil) != c.wantErr {
				t.Fatalf("SameAsUpstreamDefault(%q, %q) error = %v, want error %v", c.name, c.value, err, c.wantErr)
			}
			if err == nil && got != c.want {
				t.Errorf("SameAsUpstreamDefault(%q, %q) = %v, want %v", c.name, c.value, got, c.want)
			}
		})
	}
}

// TestUpstreamDefault: every upstream flag has its default, and a flag
// upstream lacks has none.
func TestUpstreamDefault(t *testing.T) {
	for _, name := range UpstreamFlagNames() {
		if _, ok := UpstreamDefault(name); !ok {
			t.Errorf("UpstreamDefault(%q): not found", name)
		}
	}
	if def, ok := UpstreamDefault("max-in-flight"); ok {
		t.Errorf("UpstreamDefault(max-in-flight) = %q, true; metabus's own flag is not upstream's", def)
	}
	if def, _ := UpstreamDefault("leader-election-id"); def != "metacontroller" {
		t.Errorf("UpstreamDefault(leader-election-id) = %q, want metacontroller", def)
	}
}
