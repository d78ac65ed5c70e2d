package dispatcher

import (
	"context"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/client-go/rest"
)

func TestHookDestinationsFlag(t *testing.T) {
	type result struct {
		Entries []string
		Refuse  bool
		Err     bool
	}
	tests := []struct {
		reason string
		args   []string
		want   result
	}{
		{reason: "unset: nil, anywhere as upstream", want: result{}},
		{reason: "the hardened profile's value", args: []string{"--hook-destinations=-loopback,-link-local,-apiserver,*"},
			want: result{Entries: []string{"-loopback,-link-local,-apiserver,*"}}},
		{reason: "repeated flags add up, in order", args: []string{"--hook-destinations=hooks.internal:8443", "--hook-destinations=-loopback,*"},
			want: result{Entries: []string{"hooks.internal:8443", "-loopback,*"}}},
		{reason: "a typo stops the service at start", args: []string{"--hook-destinations=-loopbak_,*"}, want: result{Err: true}},
		{reason: "an entry after * never applies: rejected, even across repeated flags",
			args: []string{"--hook-destinations=*", "--hook-destinations=-loopback"}, want: result{Entries: []string{"*"}, Err: true}},
		{reason: "credentials never over http", args: []string{"--refuse-insecure-credentials"}, want: result{Refuse: true}},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			cfg, err := parseFlags(tt.args)
			got := result{Entries: cfg.HookDestinations, Refuse: cfg.RefuseInsecureCredentials, Err: err != nil}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestAPIServerAddrs(t *testing.T) {
	tests := []struct {
		reason string
		host   string
		env    string // KUBERNETES_SERVICE_HOST
		want   []string
	}{
		{reason: "an IP host with a port", host: "https://10.96.0.1:443", want: []string{"10.96.0.1/32"}},
		{reason: "a host without a scheme", host: "192.0.2.10:6443", want: []string{"192.0.2.10/32"}},
		{reason: "an IPv6 host", host: "https://[fd00::1]:6443", want: []string{"fd00::1/128"}},
		{reason: "in a Pod: the REST host and the kubernetes Service's address, once each", host: "https://10.96.0.1:443", env: "10.96.0.1",
			want: []string{"10.96.0.1/32"}},
		{reason: "a name is resolved", host: "https://localhost:6443", want: []string{"127.0.0.1/32"}},
		{reason: "a name that does not resolve adds nothing", host: "https://no-such-host.invalid", env: "10.96.0.1", want: []string{"10.96.0.1/32"}},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			got := apiServerAddrs(context.Background(), &rest.Config{Host: tt.host}, func(k string) string {
				if k == "KUBERNETES_SERVICE_HOST" {
					return tt.env
				}
				return ""
			})
			var s []string
			for _, p := range got {
				if p.Addr().Is6() && p.Addr() == netip.IPv6Loopback() {
					continue // localhost may resolve to ::1 too, depending on the host
				}
				s = append(s, p.String())
			}
			if diff := cmp.Diff(tt.want, s); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
