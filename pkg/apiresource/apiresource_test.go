package apiresource

import (
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestAPIVersion(t *testing.T) {
	for _, tc := range []struct {
		reason string
		gvr    schema.GroupVersionResource
		want   string
	}{
		{reason: "the core group is the version alone", gvr: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, want: "v1"},
		{reason: "a named group is group/version", gvr: schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}, want: "apps/v1"},
		{reason: "a CRD's group is a named group", gvr: schema.GroupVersionResource{Group: "example.com", Version: "v1alpha1", Resource: "gadgets"}, want: "example.com/v1alpha1"},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			r := &Resource{GVR: tc.gvr}
			if got := r.APIVersion(); got != tc.want {
				t.Errorf("APIVersion() = %q, want %q", got, tc.want)
			}
		})
	}
}
