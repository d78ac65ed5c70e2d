package dispatcher

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"k8s.io/client-go/rest"

	"github.com/metabus/metabus/pkg/hooks"
)

// HookDestinationsSetting names where the hook destination policy is set,
// for refusal messages.
const HookDestinationsSetting = "the dispatcher flag --hook-destinations (Helm value dispatcher.hookDestinations)"

// InsecureCredentialsSetting says which setting refuses credentials over
// plain http whatever the webhook says.
const InsecureCredentialsSetting = "this dispatcher ignores allowInsecureCredentials (flag --refuse-insecure-credentials, " +
	"Helm value dispatcher.refuseInsecureCredentials)"

// APIServerSet is the name of the addresses of the Kubernetes API server in
// --hook-destinations.
const APIServerSet = "apiserver"

// hookDestinations parses the policy of --hook-destinations (nil entries:
// hooks.AllowAll, as upstream), with "apiserver" naming apiServer, the
// addresses the dispatcher reaches its API server at.
func hookDestinations(entries []string, apiServer []netip.Prefix) (*hooks.Destinations, error) {
	if entries == nil {
		entries = []string{hooks.AllowAll}
	}
	named := map[string][]netip.Prefix{APIServerSet: apiServer}
	d, err := hooks.ParseDestinations(entries, named, HookDestinationsSetting)
	if err != nil {
		return nil, fmt.Errorf("--hook-destinations: %w", err)
	}
	return d, nil
}

// apiServerAddrs returns the addresses of the API server as the dispatcher
// sees it: its REST host (resolved if a name) and, in a Pod, the
// kubernetes Service's address (KUBERNETES_SERVICE_HOST). The API server's
// own endpoints behind that Service are not known without reading them;
// an admin lists them as CIDRs.
func apiServerAddrs(ctx context.Context, rc *rest.Config, getenv func(string) string) []netip.Prefix {
	var hosts []string
	if rc != nil && rc.Host != "" {
		h := rc.Host
		if !strings.Contains(h, "://") {
			h = "https://" + h
		}
		if u, err := url.Parse(h); err == nil && u.Hostname() != "" {
			hosts = append(hosts, u.Hostname())
		}
	}
	if h := strings.TrimSpace(getenv("KUBERNETES_SERVICE_HOST")); h != "" {
		hosts = append(hosts, h)
	}
	var out []netip.Prefix
	add := func(a netip.Addr) {
		a = a.WithZone("").Unmap()
		p := netip.PrefixFrom(a, a.BitLen())
		for _, q := range out {
			if q == p {
				return
			}
		}
		out = append(out, p)
	}
	for _, h := range hosts {
		if a, err := netip.ParseAddr(h); err == nil {
			add(a)
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		addrs, err := net.DefaultResolver.LookupNetIP(rctx, "ip", h)
		cancel()
		if err != nil {
			continue // the caller logs the addresses found: a name that did not resolve shows there
		}
		for _, a := range addrs {
			add(a)
		}
	}
	return out
}
