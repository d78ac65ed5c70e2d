package hooks

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// apiServer is the named set the tests give the parser, as the dispatcher does.
var apiServer = map[string][]netip.Prefix{"apiserver": {netip.MustParsePrefix("10.96.0.1/32"), netip.MustParsePrefix("192.0.2.10/32")}}

func TestParseDestinationsErrors(t *testing.T) {
	tests := []struct {
		reason  string
		entries []string
		wantErr string // "" when the entries parse
	}{
		{reason: "the default", entries: []string{"*"}},
		{reason: "every kind of entry, comma-separated and repeated", entries: []string{
			"hooks.example.com:8443, *.svc.cluster.local:443,-loopback,-link-local:*", "-apiserver,10.0.0.0/8:443,[fd00::/8]:443,::1,-*:22,*"}},
		{reason: "nothing at all", entries: []string{" , "}, wantErr: `use "*" to allow every destination`},
		{reason: "a port out of range", entries: []string{"hooks.example.com:70000"}, wantErr: "from 1 to 65535"},
		{reason: "port zero", entries: []string{"*:0"}, wantErr: "from 1 to 65535"},
		{reason: "an empty port", entries: []string{"hooks.example.com:"}, wantErr: "empty target or port"},
		{reason: "a CIDR with host bits", entries: []string{"10.1.2.3/8"}, wantErr: "did you mean 10.0.0.0/8"},
		{reason: "not a host name", entries: []string{"hooks_example.com"}, wantErr: "not *, a host name"},
		{reason: "an unknown named set reads as a host name, which this is not", entries: []string{"-Link_Local"}, wantErr: "apiserver"},
		{reason: "an entry after one matching everything never applies", entries: []string{"*", "-loopback"},
			wantErr: `"-loopback" comes after "*", which matches every destination`},
		{reason: "the same after a deny of everything", entries: []string{"-*,127.0.0.2"}, wantErr: `comes after "-*"`},
		{reason: "trust: on a host name", entries: []string{"trust:hooks.example.com:443,trust:*.hooks.svc.cluster.local"}},
		{reason: "trust: on a denying entry means nothing", entries: []string{"-trust:hooks.example.com"}, wantErr: `"trust:" applies to an allowing host name`},
		{reason: "trust: on an address means nothing", entries: []string{"trust:10.0.0.0/8"}, wantErr: `"trust:" applies to an allowing host name`},
		{reason: "trust: on a named set means nothing", entries: []string{"trust:loopback"}, wantErr: `"trust:" applies to an allowing host name`},
		{reason: "an unclosed bracket", entries: []string{"[fd00::/8:443"}, wantErr: "missing ]"},
		{reason: "garbage after a bracket", entries: []string{"[::1]443"}, wantErr: `unexpected "443"`},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			_, err := ParseDestinations(tt.entries, apiServer, "--hook-destinations")
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("ParseDestinations: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("ParseDestinations = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestDestinationsCheck(t *testing.T) {
	hardened := "-loopback,-link-local,-apiserver,*"
	tests := []struct {
		reason string
		policy string
		host   string // the URL's host name ("" = the address itself)
		addr   string
		port   uint16
		// wantRule is the entry that denies ("" when allowed); "none" when no entry matches.
		wantRule string
	}{
		{reason: "the default allows anything, the metadata endpoint included", policy: "*", addr: "169.254.169.254", port: 80},
		{reason: "hardened: a public hook", policy: hardened, host: "hooks.example.com", addr: "203.0.113.7", port: 443},
		{reason: "hardened: an in-cluster service", policy: hardened, host: "hook.team-a.svc", addr: "10.0.12.4", port: 80},
		{reason: "hardened: an IP literal on loopback", policy: hardened, addr: "127.0.0.1", port: 8080, wantRule: "-loopback"},
		{reason: "hardened: anywhere in 127/8", policy: hardened, addr: "127.3.2.1", port: 8080, wantRule: "-loopback"},
		{reason: "hardened: a name resolving to loopback", policy: hardened, host: "localhost", addr: "127.0.0.1", port: 80, wantRule: "-loopback"},
		{reason: "hardened: IPv6 loopback", policy: hardened, addr: "::1", port: 80, wantRule: "-loopback"},
		{reason: "hardened: the unspecified address reaches the local host", policy: hardened, addr: "0.0.0.0", port: 80, wantRule: "-loopback"},
		{reason: "hardened: IPv4-mapped IPv6 loopback is loopback", policy: hardened, addr: "::ffff:127.0.0.1", port: 80, wantRule: "-loopback"},
		{reason: "hardened: the cloud metadata endpoint", policy: hardened, host: "metadata.google.internal", addr: "169.254.169.254", port: 80, wantRule: "-link-local"},
		{reason: "hardened: IPv6 link-local with a zone", policy: hardened, addr: "fe80::1%eth0", port: 80, wantRule: "-link-local"},
		{reason: "hardened: the API server's service address, any port", policy: hardened, host: "kubernetes.default.svc", addr: "10.96.0.1", port: 443, wantRule: "-apiserver"},
		{reason: "hardened: the API server's endpoint address", policy: hardened, addr: "192.0.2.10", port: 10250, wantRule: "-apiserver"},
		{reason: "an exception listed first wins over a later deny", policy: "127.0.0.2," + hardened, addr: "127.0.0.2", port: 8080},
		{reason: "an exception by name does not reach loopback it resolves to", policy: "hooks.internal:8443," + hardened, host: "hooks.internal", addr: "127.0.0.1", port: 8443, wantRule: "-loopback"},
		{reason: "a trusted exception by name trusts what the name resolves to", policy: "trust:hooks.internal:8443," + hardened, host: "hooks.internal", addr: "127.0.0.1", port: 8443},
		{reason: "a trusted exception by name is for its port only", policy: "trust:hooks.internal:8443," + hardened, host: "hooks.internal", addr: "127.0.0.1", port: 8444, wantRule: "-loopback"},
		{reason: "an exception by name reaches an ordinary address", policy: "hooks.internal:8443," + hardened, host: "hooks.internal", addr: "203.0.113.7", port: 8443},
		{reason: "an allow list by name: a tenant's Service aimed at the API server is refused though no entry denies it", policy: "*.hooks.svc.cluster.local:443",
			host: "evil.hooks.svc.cluster.local", addr: "10.96.0.1", port: 443, wantRule: "-apiserver"},
		{reason: "an allow list by name: a tenant's Service aimed at the metadata endpoint", policy: "*.hooks.svc.cluster.local",
			host: "evil.hooks.svc.cluster.local", addr: "169.254.169.254", port: 80, wantRule: "-link-local"},
		{reason: "an allow list by name: at AWS's IPv6 metadata endpoint", policy: "*.hooks.svc.cluster.local",
			host: "evil.hooks.svc.cluster.local", addr: "fd00:ec2::254", port: 80, wantRule: "-link-local"},
		{reason: "an allow list by name: at loopback", policy: "*.hooks.svc.cluster.local",
			host: "evil.hooks.svc.cluster.local", addr: "127.0.0.1", port: 80, wantRule: "-loopback"},
		{reason: "an allow list by name: an ordinary Service's cluster address", policy: "*.hooks.svc.cluster.local:443",
			host: "a.hooks.svc.cluster.local", addr: "10.0.12.4", port: 443},
		{reason: "a name is held to a later address deny of the policy (-private)", policy: "hooks.example.com,-private,*",
			host: "hooks.example.com", addr: "10.1.2.3", port: 443, wantRule: "-private"},
		{reason: "a later address deny on another port does not apply", policy: "hooks.example.com,-10.0.0.0/8:22,*",
			host: "hooks.example.com", addr: "10.1.2.3", port: 443},
		{reason: "a trusted name reaches the private range a later entry denies", policy: "trust:hooks.example.com,-private,*",
			host: "hooks.example.com", addr: "10.1.2.3", port: 443},
		{reason: "hardened: AWS's IPv6 metadata endpoint", policy: hardened, addr: "fd00:ec2::254", port: 80, wantRule: "-link-local"},
		{reason: "hardened: Alibaba Cloud's metadata endpoint", policy: hardened, addr: "100.100.100.200", port: 80, wantRule: "-link-local"},
		{reason: "hardened: Azure's WireServer", policy: hardened, addr: "168.63.129.16", port: 80, wantRule: "-link-local"},
		{reason: "hardened: the address next to Azure's WireServer is not metadata", policy: hardened, addr: "168.63.129.17", port: 80},
		{reason: "an exception listed after the deny never applies", policy: "-loopback,127.0.0.2,-link-local,*", addr: "127.0.0.2", port: 8080, wantRule: "-loopback"},
		{reason: "an allow list: a matching subdomain", policy: "*.hooks.example.com:443,10.0.0.0/8", host: "a.hooks.example.com", addr: "203.0.113.7", port: 443},
		{reason: "an allow list: the wildcard's own domain does not match", policy: "*.hooks.example.com:443", host: "hooks.example.com", addr: "203.0.113.7", port: 443, wantRule: "none"},
		{reason: "an allow list: a look-alike domain does not match", policy: "*.hooks.example.com:443", host: "evilhooks.example.com", addr: "203.0.113.7", port: 443, wantRule: "none"},
		{reason: "an allow list: the wrong port", policy: "*.hooks.example.com:443", host: "a.hooks.example.com", addr: "203.0.113.7", port: 80, wantRule: "none"},
		{reason: "an allow list by CIDR", policy: "*.hooks.example.com:443,10.0.0.0/8", host: "x.svc", addr: "10.1.2.3", port: 9000},
		{reason: "host names match case-insensitively, a final dot ignored", policy: "-evil.example.com,*", host: "EVIL.example.com.", addr: "203.0.113.9", port: 443, wantRule: "-evil.example.com"},
		{reason: "a denied port anywhere", policy: "-*:22,*", host: "hooks.example.com", addr: "203.0.113.7", port: 22, wantRule: "-*:22"},
		{reason: "a bracketed IPv6 CIDR with a port", policy: "[fd00::/8]:443,-*", addr: "fd12::1", port: 443},
		{reason: "a bracketed IPv6 CIDR, another port", policy: "[fd00::/8]:443,-*", addr: "fd12::1", port: 80, wantRule: "-*"},
		{reason: "private addresses", policy: "-private,*", host: "db.internal", addr: "172.20.1.1", port: 5432, wantRule: "-private"},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			d, err := ParseDestinations([]string{tt.policy}, apiServer, "--hook-destinations")
			if err != nil {
				t.Fatal(err)
			}
			host := tt.host
			if host == "" {
				host = tt.addr
			}
			err = d.Check(host, netip.MustParseAddr(tt.addr), tt.port)
			got := ""
			var denied *DestinationError
			switch {
			case errors.As(err, &denied) && denied.Rule == "":
				got = "none"
			case errors.As(err, &denied):
				got = denied.Rule
			case err != nil:
				t.Fatalf("Check: unexpected error %v", err)
			}
			if diff := cmp.Diff(tt.wantRule, got); diff != "" {
				t.Errorf("denying rule (-want +got):\n%s\nerr: %v", diff, err)
			}
			if err != nil && !strings.Contains(err.Error(), "--hook-destinations") {
				t.Errorf("the refusal %q does not say where to allow it", err)
			}
		})
	}
}

// The policy is checked on the address actually dialled, after resolution: a hook at a name
// that resolves to a denied address is refused before any byte is sent, and so is a redirect
// to a denied destination. Nothing reaches the listener behind the denied address.
func TestDestinationsEnforcedAtDial(t *testing.T) {
	victim, victimRec := serve(t, replyJSON(`{"secret":"the victim answered"}`))
	vu, err := url.Parse(victim.URL)
	if err != nil {
		t.Fatal(err)
	}
	_, victimPort, _ := net.SplitHostPort(vu.Host)
	policy, err := ParseDestinations([]string{"-127.0.0.1:" + victimPort + ",*"}, nil, "--hook-destinations")
	if err != nil {
		t.Fatal(err)
	}
	origin, _ := serve(t, func(w http.ResponseWriter, r *http.Request) {
		if to := r.URL.Query().Get("to"); to != "" {
			http.Redirect(w, r, to, http.StatusTemporaryRedirect)
			return
		}
		replyJSON(`{}`)(w, r)
	})
	c := New(Options{Destinations: policy})
	tests := []struct {
		reason       string
		url          string
		wantRedirect bool
	}{
		{reason: "an IP literal", url: victim.URL + "/sync"},
		{reason: "a name that resolves to the denied address", url: "http://localhost:" + victimPort + "/sync"},
		{reason: "a redirect to the denied destination", url: origin.URL + "/sync?to=" + url.QueryEscape(victim.URL+"/sync"), wantRedirect: true},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			err := c.Do(context.Background(), syncCall(hookAt(tt.url)), &syncResponse{})
			var refused *RefusedError
			if !errors.As(err, &refused) {
				t.Fatalf("Do = %v, want a *RefusedError", err)
			}
			if want := `"-127.0.0.1:` + victimPort + `"`; !strings.Contains(err.Error(), want) {
				t.Errorf("the refusal %q does not name the rule %s", err, want)
			}
			if got := refused.Redirect != ""; got != tt.wantRedirect {
				t.Errorf("refused a redirect: %v, want %v (%v)", got, tt.wantRedirect, err)
			}
		})
	}
	if n := victimRec.count(); n != 0 {
		t.Errorf("the denied listener received %d requests", n)
	}
	// Other destinations are still reached.
	if err := c.Do(context.Background(), syncCall(hookAt(origin.URL+"/sync")), &syncResponse{}); err != nil {
		t.Errorf("an allowed hook: %v", err)
	}
}

// AllowsAll is what keeps the default (and any policy starting with a plain "*") off the dial
// path entirely.
func TestDestinationsAllowsAll(t *testing.T) {
	for policy, want := range map[string]bool{"*": true, "-loopback,*": false, "*:443": false, "hooks.example.com": false} {
		d, err := ParseDestinations([]string{policy}, nil, "x")
		if err != nil {
			t.Fatal(err)
		}
		if got := d.AllowsAll(); got != want {
			t.Errorf("%q: AllowsAll = %v, want %v", policy, got, want)
		}
	}
	var none *Destinations
	if !none.AllowsAll() || none.Check("x", netip.MustParseAddr("127.0.0.1"), 1) != nil {
		t.Error("a nil policy must allow everything")
	}
}
