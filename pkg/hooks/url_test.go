package hooks

import (
	"math"
	"net/url"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
)

func TestURL(t *testing.T) {
	svc := func(mod func(*v1alpha1.ServiceReference)) *v1alpha1.ServiceReference {
		s := &v1alpha1.ServiceReference{Name: "hook", Namespace: "tools"}
		if mod != nil {
			mod(s)
		}
		return s
	}
	tests := []struct {
		reason  string
		webhook *v1alpha1.Webhook
		want    string
		wantErr bool
	}{
		{reason: "url is used as is", webhook: &v1alpha1.Webhook{URL: ptr("http://h.example:8080/sync?x=1")}, want: "http://h.example:8080/sync?x=1"},
		{reason: "url overrides service and path", webhook: &v1alpha1.Webhook{URL: ptr("https://h.example/a"), Service: svc(nil), Path: ptr("/b")}, want: "https://h.example/a"},
		{reason: "service defaults to http and port 80", webhook: &v1alpha1.Webhook{Service: svc(nil), Path: ptr("/sync")}, want: "http://hook.tools:80/sync"},
		{reason: "service with protocol https and a port", webhook: &v1alpha1.Webhook{
			Service: svc(func(s *v1alpha1.ServiceReference) { s.Protocol = ptr("https"); s.Port = ptr(int32(8443)) }), Path: ptr("/sync")},
			want: "https://hook.tools:8443/sync"},
		{reason: "a path without a leading slash gets one", webhook: &v1alpha1.Webhook{Service: svc(nil), Path: ptr("sync")}, want: "http://hook.tools:80/sync"},
		{reason: "a service without a path calls the root", webhook: &v1alpha1.Webhook{Service: svc(nil)}, want: "http://hook.tools:80"},
		{reason: "an empty url falls back to the service", webhook: &v1alpha1.Webhook{URL: ptr(""), Service: svc(nil), Path: ptr("/s")}, want: "http://hook.tools:80/s"},
		{reason: "nil webhook", wantErr: true},
		{reason: "neither url nor service", webhook: &v1alpha1.Webhook{Path: ptr("/sync")}, wantErr: true},
		{reason: "service without namespace", webhook: &v1alpha1.Webhook{Service: &v1alpha1.ServiceReference{Name: "hook"}}, wantErr: true},
		{reason: "port out of range", webhook: &v1alpha1.Webhook{Service: svc(func(s *v1alpha1.ServiceReference) { s.Port = ptr(int32(70000)) })}, wantErr: true},
		{reason: "unsupported protocol", webhook: &v1alpha1.Webhook{Service: svc(func(s *v1alpha1.ServiceReference) { s.Protocol = ptr("grpc") })}, wantErr: true},
		{reason: "url without scheme", webhook: &v1alpha1.Webhook{URL: ptr("hook.tools/sync")}, wantErr: true},
		{reason: "url with a control character", webhook: &v1alpha1.Webhook{URL: ptr("http://h\x7f/")}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			got, err := URL(tt.webhook)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("URL = %q, want an error", got)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("URL = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestTimeout(t *testing.T) {
	d := func(x time.Duration) *metav1.Duration { return &metav1.Duration{Duration: x} }
	tests := []struct {
		reason  string
		webhook *v1alpha1.Webhook
		want    time.Duration
	}{
		{reason: "nil webhook", want: DefaultTimeout},
		{reason: "unset", webhook: &v1alpha1.Webhook{}, want: 10 * time.Second},
		{reason: "set", webhook: &v1alpha1.Webhook{Timeout: d(3 * time.Second)}, want: 3 * time.Second},
		{reason: "zero falls back", webhook: &v1alpha1.Webhook{Timeout: d(0)}, want: 10 * time.Second},
		{reason: "negative falls back", webhook: &v1alpha1.Webhook{Timeout: d(-time.Second)}, want: 10 * time.Second},
	}
	for _, tt := range tests {
		if got := Timeout(tt.webhook); got != tt.want {
			t.Errorf("%s: Timeout = %s, want %s", tt.reason, got, tt.want)
		}
	}
}

// One slow controller must not hold a partition's message for long: webhook.timeout (and the
// default, Options.DefaultTimeout) is bounded at 60 s.
func TestTimeoutIsBounded(t *testing.T) {
	d := func(x time.Duration) *metav1.Duration { return &metav1.Duration{Duration: x} }
	tests := []struct {
		reason  string
		webhook *v1alpha1.Webhook
		def     time.Duration // the client's default timeout
		want    time.Duration
	}{
		{reason: "below the bound", webhook: &v1alpha1.Webhook{Timeout: d(59 * time.Second)}, def: DefaultTimeout, want: 59 * time.Second},
		{reason: "at the bound", webhook: &v1alpha1.Webhook{Timeout: d(60 * time.Second)}, def: DefaultTimeout, want: 60 * time.Second},
		{reason: "above the bound", webhook: &v1alpha1.Webhook{Timeout: d(61 * time.Second)}, def: DefaultTimeout, want: 60 * time.Second},
		{reason: "an hour", webhook: &v1alpha1.Webhook{Timeout: d(time.Hour)}, def: DefaultTimeout, want: 60 * time.Second},
		{reason: "the largest duration", webhook: &v1alpha1.Webhook{Timeout: d(math.MaxInt64)}, def: DefaultTimeout, want: 60 * time.Second},
		{reason: "a default above the bound, webhook.timeout unset", webhook: &v1alpha1.Webhook{}, def: 5 * time.Minute, want: 60 * time.Second},
		{reason: "a default above the bound, no webhook", def: 5 * time.Minute, want: 60 * time.Second},
		{reason: "a default below the bound", webhook: &v1alpha1.Webhook{Timeout: d(0)}, def: 20 * time.Second, want: 20 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, timeoutOr(tt.webhook, tt.def)); diff != "" {
				t.Errorf("timeoutOr (-want +got):\n%s", diff)
			}
		})
	}
	if diff := cmp.Diff(60*time.Second, Timeout(&v1alpha1.Webhook{Timeout: d(2 * time.Minute)})); diff != "" {
		t.Errorf("Timeout of a 2m webhook.timeout (-want +got):\n%s", diff)
	}
}

func TestMatchEndpointConfig(t *testing.T) {
	tests := []struct {
		reason string
		url    string
		hosts  []string
		want   string // matched host, "" for none
	}{
		{reason: "exact host", url: "https://hooks.example.com/sync", hosts: []string{"hooks.example.com"}, want: "hooks.example.com"},
		{reason: "case-insensitive", url: "https://Hooks.Example.com/sync", hosts: []string{"HOOKS.example.COM"}, want: "HOOKS.example.COM"},
		{reason: "https default port folded: config with :443", url: "https://hooks.example.com/sync", hosts: []string{"hooks.example.com:443"}, want: "hooks.example.com:443"},
		{reason: "https default port folded: url with :443", url: "https://hooks.example.com:443/sync", hosts: []string{"hooks.example.com"}, want: "hooks.example.com"},
		{reason: "http default port folded", url: "http://hook.tools:80/sync", hosts: []string{"hook.tools"}, want: "hook.tools"},
		{reason: "http :80 config matches a url without port", url: "http://hook.tools/sync", hosts: []string{"hook.tools:80"}, want: "hook.tools:80"},
		{reason: "a port-less config means the default port only", url: "https://hooks.example.com:8443/sync", hosts: []string{"hooks.example.com"}},
		{reason: "the port must match", url: "https://hooks.example.com:8443/sync", hosts: []string{"hooks.example.com:443", "hooks.example.com:8443"}, want: "hooks.example.com:8443"},
		{reason: ":443 is not the http default", url: "http://hooks.example.com/sync", hosts: []string{"hooks.example.com:443"}},
		{reason: "first match wins", url: "https://a.example/", hosts: []string{"b.example", "a.example", "A.example:443"}, want: "a.example"},
		{reason: "IPv6 with port", url: "https://[::1]:9443/", hosts: []string{"[::1]:9443"}, want: "[::1]:9443"},
		{reason: "IPv6 without port", url: "https://[::1]/", hosts: []string{"::1"}, want: "::1"},
		{reason: "no match", url: "https://a.example/", hosts: []string{"a.example.org"}},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			u, err := url.Parse(tt.url)
			if err != nil {
				t.Fatal(err)
			}
			var configs []v1alpha1.EndpointConfig
			for _, h := range tt.hosts {
				configs = append(configs, v1alpha1.EndpointConfig{Host: h})
			}
			got := ""
			if ec := matchEndpointConfig(u, configs); ec != nil {
				got = ec.Host
			}
			if got != tt.want {
				t.Errorf("matched %q, want %q", got, tt.want)
			}
		})
	}
}
