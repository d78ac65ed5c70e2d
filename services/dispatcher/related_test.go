package dispatcher

import (
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/metabus/metabus/pkg/hooks"
	"github.com/metabus/metabus/pkg/related"
)

func TestRelatedResourcesFlag(t *testing.T) {
	type result struct {
		Entries []string
		Err     bool
	}
	tests := []struct {
		reason string
		args   []string
		want   result
	}{
		{reason: "unset: nil, the default policy", want: result{}},
		{reason: "a comma-separated list", args: []string{"--related-resources=core/configmaps,apps/*"}, want: result{Entries: []string{"core/configmaps", "apps/*"}}},
		{reason: "repeated flags add up", args: []string{"--related-resources=*", "--related-resources=-core/events"}, want: result{Entries: []string{"*", "-core/events"}}},
		{reason: "an empty value: nothing allowed (not the default)", args: []string{"--related-resources="}, want: result{Entries: []string{""}}},
		{reason: "a malformed entry is rejected at parse time", args: []string{"--related-resources=secrets"}, want: result{Err: true}},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			cfg, err := parseFlags(tt.args)
			got := result{Entries: cfg.RelatedResources, Err: err != nil}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// A refused related rule is the controller's fault, like a refused hook
// call: failed() then also reports it on the controller, where its author
// looks.
func TestControllerFault(t *testing.T) {
	tests := []struct {
		reason string
		err    error
		want   bool
	}{
		{reason: "a refused related rule, wrapped", err: fmt.Errorf("sync: %w", &related.RefusedError{Resource: "secrets"}), want: true},
		{reason: "a refused hook call", err: &hooks.RefusedError{Reason: "plain http"}, want: true},
		{reason: "a hook that failed", err: errors.New("customize hook failed: 500")},
		{reason: "no error", err: nil},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			if got := controllerFault(tt.err); got != tt.want {
				t.Errorf("controllerFault(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
