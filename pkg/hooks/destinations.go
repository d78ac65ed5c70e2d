package hooks

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Destinations is an admin's policy of where hooks may be called. A
// controller author chooses its hooks' URLs, and the dispatcher sends them
// every object the controller observes (related Secrets included) with its
// own network position: without a policy a hook can be aimed at a cloud
// metadata endpoint, the API server, or any in-cluster service.
//
// The policy is a list of entries read in order; the first entry matching a
// destination decides, and a destination no entry matches is denied. An
// entry is
//
//	[-]TARGET[:PORT]
//
// where a leading "-" denies, PORT is a number or "*" (absent: any port),
// and TARGET is one of
//
//   - "*": anything;
//   - a host name ("hooks.example.com") or a wildcard for its subdomains
//     ("*.example.com", which does not match example.com itself), matched
//     against the name in the hook's URL. Allowing a name does not trust
//     whatever it resolves to: the address is still checked against the
//     sets a name never reaches (loopback, link-local and every set the
//     caller names, such as apiserver) and against every address entry of
//     the policy that denies (a "-private" anywhere in it, say), so that a
//     tenant who controls the name's records (a Service of
//     *.hooks.svc.cluster.local whose endpoints or ExternalName they set)
//     cannot aim it at the API server or a metadata endpoint. An admin who
//     truly means a name to reach such an address writes it "trust:NAME"
//     ("trust:hooks.internal:8443"), which trusts whatever it resolves to;
//   - an IP address or CIDR ("10.0.0.0/8", "fd00::/8"; with a port, an IPv6
//     one in brackets: "[fd00::/8]:443"), matched against the address
//     actually dialled, after DNS resolution;
//   - a named set of addresses: "loopback" (127.0.0.0/8, ::1, and the
//     unspecified 0.0.0.0/8 and ::, which reach the local host),
//     "link-local" (169.254.0.0/16 and fe80::/10, where most clouds serve
//     instance metadata, plus the metadata and host-agent addresses
//     outside them: AWS's IPv6 IMDS fd00:ec2::254, Alibaba Cloud's
//     100.100.100.200, Azure's WireServer 168.63.129.16),
//     "private" (10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10,
//     fc00::/7), or a set the caller names (the dispatcher names
//     "apiserver": the addresses its Kubernetes API server answers on).
//
// Every dial is checked, after DNS resolution and just before the
// connection is opened (net.Dialer.Control), so a name that resolves to an
// allowed address when checked and a denied one when used (DNS rebinding)
// cannot pass, and neither can a redirect to a denied destination.
//
// Examples: "*" (the default: anything, as upstream Metacontroller);
// "-loopback,-link-local,-apiserver,*" (anything but those);
// "hooks.internal:8443,-loopback,-link-local,-apiserver,*" (the same, one
// name on one port allowed if it does not resolve to a denied address);
// "trust:hooks.internal:8443,-loopback,-link-local,-apiserver,*" (that
// name even if it does);
// "*.hooks.svc.cluster.local:443,203.0.113.0/24" (only those).
type Destinations struct {
	entries []destEntry
	// guards are the sets a host name entry never reaches untrusted:
	// loopback, link-local and the caller's named sets.
	guards []nameGuard
	// Setting names where the policy comes from (a flag, a Helm value), for
	// refusal messages.
	setting string
}

// destEntry is one parsed entry.
type destEntry struct {
	raw      string
	deny     bool
	any      bool
	host     string // exact host name
	suffix   string // ".example.com" for "*.example.com"
	prefixes []netip.Prefix
	port     uint16 // 0: any
	// trust makes an allowing host name entry trust any address it
	// resolves to ("trust:" prefix).
	trust bool
}

// nameGuard is a set of addresses an allowing host name entry does not
// reach unless it is trusted.
type nameGuard struct {
	name     string
	prefixes []netip.Prefix
}

// Named sets of addresses every policy knows.
var namedSets = map[string][]netip.Prefix{
	"loopback": mustPrefixes("127.0.0.0/8", "::1/128", "0.0.0.0/8", "::/128"),
	"link-local": mustPrefixes("169.254.0.0/16", "fe80::/10",
		// Instance metadata and host agents outside link-local: AWS IMDS
		// over IPv6, Alibaba Cloud's metadata service, Azure's WireServer
		// (which also relays the instance's extensions and health).
		"fd00:ec2::254/128", "100.100.100.200/32", "168.63.129.16/32"),
	"private": mustPrefixes("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7"),
}

func mustPrefixes(cidrs ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(cidrs))
	for i, c := range cidrs {
		out[i] = netip.MustParsePrefix(c)
	}
	return out
}

// AllowAll is the default policy's one entry.
const AllowAll = "*"

// ParseDestinations parses a policy's entries (each may itself be a
// comma-separated list). named adds sets of addresses usable as targets
// (e.g. "apiserver"); a name in it may map to no address, which matches
// nothing. setting names the policy's source in refusal messages.
func ParseDestinations(entries []string, named map[string][]netip.Prefix, setting string) (*Destinations, error) {
	d := &Destinations{setting: setting}
	// The caller's sets first: the API server on a loopback address is
	// named as the API server.
	for _, name := range slices.Sorted(maps.Keys(named)) {
		d.guards = append(d.guards, nameGuard{name, named[name]})
	}
	for _, name := range []string{"loopback", "link-local"} {
		d.guards = append(d.guards, nameGuard{name, namedSets[name]})
	}
	for _, list := range entries {
		for _, raw := range strings.Split(list, ",") {
			raw = strings.TrimSpace(raw)
			if raw == "" {
				continue
			}
			e, err := parseDestEntry(raw, named)
			if err != nil {
				return nil, fmt.Errorf("hook destination %q: %w", raw, err)
			}
			if n := len(d.entries); n > 0 && d.entries[n-1].any && d.entries[n-1].port == 0 {
				// A list read as "deny wins" would mean something else: say so.
				return nil, fmt.Errorf("hook destination %q comes after %q, which matches every destination: "+
					"it never applies (the first matching entry decides; put exceptions first)", raw, d.entries[n-1].raw)
			}
			d.entries = append(d.entries, e)
		}
	}
	if len(d.entries) == 0 {
		return nil, errors.New(`no hook destination entries: use "*" to allow every destination`)
	}
	return d, nil
}

func parseDestEntry(raw string, named map[string][]netip.Prefix) (destEntry, error) {
	e := destEntry{raw: raw}
	s := raw
	if rest, ok := strings.CutPrefix(s, "-"); ok {
		e.deny, s = true, rest
	}
	if rest, ok := strings.CutPrefix(s, "trust:"); ok {
		e.trust, s = true, rest
	}
	target, port, err := splitDestPort(s)
	if err != nil {
		return e, err
	}
	if port != "" && port != "*" {
		n, err := strconv.ParseUint(port, 10, 16)
		if err != nil || n == 0 {
			return e, fmt.Errorf("port %q: want a number from 1 to 65535, or *", port)
		}
		e.port = uint16(n)
	}
	target = strings.ToLower(target)
	switch {
	case target == "*":
		e.any = true
	case namedSets[target] != nil:
		e.prefixes = namedSets[target]
	case named != nil && hasKey(named, target):
		e.prefixes = named[target]
	default:
		if p, err := netip.ParsePrefix(target); err == nil {
			if p != p.Masked() {
				return e, fmt.Errorf("CIDR %s has host bits set (did you mean %s?)", p, p.Masked())
			}
			e.prefixes = []netip.Prefix{unmapPrefix(p)}
			break
		}
		if a, err := netip.ParseAddr(target); err == nil {
			if a.Zone() != "" {
				return e, errors.New("an address with a zone cannot be matched")
			}
			a = a.Unmap()
			e.prefixes = []netip.Prefix{netip.PrefixFrom(a, a.BitLen())}
			break
		}
		name, wildcard := strings.CutPrefix(target, "*.")
		name = strings.TrimSuffix(name, ".")
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			return e, fmt.Errorf("not *, a host name, *.<domain>, an IP address, a CIDR or one of loopback, link-local, private%s: %s",
				namedList(named), strings.Join(errs, "; "))
		}
		if wildcard {
			e.suffix = "." + name
		} else {
			e.host = name
		}
	}
	if e.trust && (e.deny || (e.host == "" && e.suffix == "")) {
		return e, errors.New(`"trust:" applies to an allowing host name or *.<domain> only: an address entry is matched on the address already`)
	}
	return e, nil
}

func hasKey(m map[string][]netip.Prefix, k string) bool {
	_, ok := m[k]
	return ok
}

func namedList(named map[string][]netip.Prefix) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(named)) {
		b.WriteString(", " + k)
	}
	return b.String()
}

// unmapPrefix turns an IPv4-mapped IPv6 prefix into its IPv4 form, as
// addresses are matched unmapped.
func unmapPrefix(p netip.Prefix) netip.Prefix {
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		return netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p
}

// splitDestPort splits "target[:port]", with IPv6 addresses and CIDRs
// either bare (no port) or in brackets.
func splitDestPort(s string) (target, port string, err error) {
	if s == "" {
		return "", "", errors.New("empty target")
	}
	if strings.HasPrefix(s, "[") {
		end := strings.Index(s, "]")
		if end < 0 {
			return "", "", errors.New("missing ]")
		}
		target, rest := s[1:end], s[end+1:]
		if rest == "" {
			return target, "", nil
		}
		if port, ok := strings.CutPrefix(rest, ":"); ok && port != "" {
			return target, port, nil
		}
		return "", "", fmt.Errorf("unexpected %q after ]", rest)
	}
	// A bare IPv6 address or CIDR has colons of its own.
	if _, err := netip.ParsePrefix(s); err == nil {
		return s, "", nil
	}
	if _, err := netip.ParseAddr(s); err == nil {
		return s, "", nil
	}
	if i := strings.LastIndex(s, ":"); i >= 0 {
		if i == 0 || i == len(s)-1 {
			return "", "", errors.New("empty target or port")
		}
		return s[:i], s[i+1:], nil
	}
	return s, "", nil
}

// AllowsAll reports whether the policy lets every destination through, so
// that the dialer need not check anything.
func (d *Destinations) AllowsAll() bool {
	return d == nil || (len(d.entries) > 0 && d.entries[0].any && !d.entries[0].deny && d.entries[0].port == 0)
}

// String returns the entries as given.
func (d *Destinations) String() string {
	if d == nil {
		return AllowAll
	}
	raw := make([]string, len(d.entries))
	for i, e := range d.entries {
		raw[i] = e.raw
	}
	return strings.Join(raw, ",")
}

// DestinationError is a destination the policy denies.
type DestinationError struct {
	// Host is the host name the hook's URL (or a redirect) names, Addr the
	// address it resolved to and Port the port.
	Host string
	Addr netip.Addr
	Port uint16
	// Rule is the entry that denied it; "" when no entry matched.
	Rule string
	// NameRule is the host name entry that allowed the name, when the
	// address it resolved to was denied all the same (Rule is then the
	// address entry or the set that denied it).
	NameRule string
	setting  string
}

func (e *DestinationError) Error() string {
	dest := netip.AddrPortFrom(e.Addr, e.Port).String()
	if e.Host != "" && e.Host != e.Addr.String() {
		dest += fmt.Sprintf(" (%s)", e.Host)
	}
	if e.NameRule != "" {
		return fmt.Sprintf("destination %s is allowed by name by the hook destination rule %q, but the address it resolves to "+
			"is denied by %q, which a host name rule does not override unless trusted; an admin who means it can write %q in %s",
			dest, e.NameRule, e.Rule, "trust:"+e.NameRule, e.setting)
	}
	if e.Rule == "" {
		return fmt.Sprintf("destination %s matches no entry of the hook destination policy, which denies it; "+
			"an admin can allow it in %s", dest, e.setting)
	}
	return fmt.Sprintf("destination %s is denied by the hook destination rule %q; "+
		"an admin can allow it with an entry before that rule in %s", dest, e.Rule, e.setting)
}

// Check returns nil when a hook may connect to addr:port, reached through
// host (the name in the URL, or the address itself), else a
// *DestinationError.
func (d *Destinations) Check(host string, addr netip.Addr, port uint16) error {
	if d.AllowsAll() {
		return nil
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	addr = addr.WithZone("").Unmap()
	for _, e := range d.entries {
		if e.matches(host, addr, port) {
			if e.deny {
				return &DestinationError{Host: host, Addr: addr, Port: port, Rule: e.raw, setting: d.setting}
			}
			if (e.host != "" || e.suffix != "") && !e.trust {
				if rule := d.addressDenied(addr, port); rule != "" {
					return &DestinationError{Host: host, Addr: addr, Port: port, Rule: rule, NameRule: e.raw, setting: d.setting}
				}
			}
			return nil
		}
	}
	return &DestinationError{Host: host, Addr: addr, Port: port, setting: d.setting}
}

// addressDenied returns what denies addr:port to an allowing host name
// entry: a guarded set ("-loopback", "-apiserver"...) or the policy's
// first denying address entry matching it; "" when nothing does.
func (d *Destinations) addressDenied(addr netip.Addr, port uint16) string {
	if !addr.IsValid() {
		return ""
	}
	for _, g := range d.guards {
		for _, p := range g.prefixes {
			if p.Contains(addr) {
				return "-" + g.name
			}
		}
	}
	for _, e := range d.entries {
		if e.deny && len(e.prefixes) > 0 && e.matches("", addr, port) {
			return e.raw
		}
	}
	return ""
}

func (e destEntry) matches(host string, addr netip.Addr, port uint16) bool {
	if e.port != 0 && e.port != port {
		return false
	}
	switch {
	case e.any:
		return true
	case e.host != "":
		return host == e.host
	case e.suffix != "":
		return strings.HasSuffix(host, e.suffix)
	}
	for _, p := range e.prefixes {
		if addr.IsValid() && p.Contains(addr) {
			return true
		}
	}
	return false
}

// dialContext returns a DialContext that checks every address it connects
// to against the policy, after resolution and before the connection is
// opened.
func (d *Destinations) dialContext(base *net.Dialer) func(ctx context.Context, network, address string) (net.Conn, error) {
	return func(ctx context.Context, network, address string) (net.Conn, error) {
		host, _, err := net.SplitHostPort(address)
		if err != nil {
			return nil, err
		}
		dialer := *base
		dialer.Control = func(_, resolved string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(resolved)
			if err != nil {
				return fmt.Errorf("hook destination %q: %w", resolved, err)
			}
			return d.Check(host, ap.Addr(), ap.Port())
		}
		return dialer.DialContext(ctx, network, address)
	}
}
