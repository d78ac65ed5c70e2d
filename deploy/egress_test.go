package deploy

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestDispatcherEgress (issue 35): the hardened profile of either tool
// ships an egress NetworkPolicy for the dispatcher's pods, which lets them
// reach DNS, NATS and the API server's ports and nothing else an address
// could be: no metadata endpoint on any port, no other port anywhere. The
// default profile ships none (upstream calls hooks anywhere), and Helm's
// dispatcher.egress adds hook destinations or turns it off.
func TestDispatcherEgress(t *testing.T) {
	def, hardened := renders(t)
	for _, r := range def {
		if p := dispatcherEgress(r.objs); p != nil {
			t.Errorf("%s: an egress NetworkPolicy for the dispatcher in the default profile: %v", r.name, p)
		}
	}
	type probe struct {
		addr string
		port int
	}
	tests := []struct {
		reason string
		probe
		want bool
	}{
		{reason: "the API server anywhere on 443", probe: probe{"10.96.0.1", 443}, want: true},
		{reason: "the API server on 6443", probe: probe{"192.0.2.10", 6443}, want: true},
		{reason: "the API server over IPv6", probe: probe{"2001:db8::1", 443}, want: true},
		{reason: "a hook on another port", probe: probe{"203.0.113.7", 8080}},
		{reason: "plain http anywhere", probe: probe{"203.0.113.7", 80}},
		{reason: "the metadata endpoint", probe: probe{"169.254.169.254", 80}},
		{reason: "the metadata endpoint on 443", probe: probe{"169.254.169.254", 443}},
		{reason: "AWS's IPv6 metadata endpoint on 443", probe: probe{"fd00:ec2::254", 443}},
		{reason: "Alibaba Cloud's metadata endpoint on 443", probe: probe{"100.100.100.200", 443}},
		{reason: "Azure's WireServer on 443", probe: probe{"168.63.129.16", 443}},
		{reason: "IPv6 link-local on 443", probe: probe{"fe80::1", 443}},
		{reason: "DNS at an address that is no DNS pod", probe: probe{"203.0.113.53", 53}},
	}
	var specs []any
	for _, r := range hardened {
		t.Run(r.name, func(t *testing.T) {
			p := dispatcherEgress(r.objs)
			if p == nil {
				t.Fatal("no egress NetworkPolicy selects the dispatcher's pods")
			}
			for _, tt := range tests {
				if got := ipAllowed(p, netip.MustParseAddr(tt.addr), tt.port); got != tt.want {
					t.Errorf("%s: %s:%d allowed %v, want %v", tt.reason, tt.addr, tt.port, got, tt.want)
				}
			}
			// DNS and NATS by pod: the NATS rule selects the NATS pods of
			// this render.
			nats := find(r.objs, "StatefulSet", "metabus-nats")
			if nats == nil {
				nats = find(r.objs, "StatefulSet", "nats")
			}
			if nats == nil {
				t.Fatal("no NATS StatefulSet")
			}
			natsLabels := mapping(nats, "spec", "template", "metadata", "labels")
			var dns, toNATS bool
			for _, rule := range slice(p, "spec", "egress") {
				rule, _ := rule.(map[string]any)
				for _, peer := range slice(rule, "to") {
					peer, _ := peer.(map[string]any)
					sel := mapping(peer, "podSelector", "matchLabels")
					switch {
					case sel["k8s-app"] == "kube-dns" && fmt.Sprint(portsOf(rule)) == "[53 53]":
						dns = true
					case sel != nil && selects(sel, natsLabels) && fmt.Sprint(portsOf(rule)) == "[4222]":
						toNATS = true
					}
				}
			}
			if !dns || !toNATS {
				t.Errorf("DNS allowed %v, NATS allowed %v: want both", dns, toNATS)
			}
			specs = append(specs, slice(p, "spec", "egress")[2])
		})
	}
	// The API server's rule is the same in both tools.
	if len(specs) == 2 {
		if diff := cmp.Diff(specs[0], specs[1]); diff != "" {
			t.Errorf("the API server's rule (-kustomize +helm):\n%s", diff)
		}
	}

	// Helm: hook destinations an admin lists, or the policy off.
	hook := map[string]any{"to": []any{map[string]any{"ipBlock": map[string]any{"cidr": "203.0.113.0/24"}}}, "ports": []any{map[string]any{"port": 8443}}}
	objs, err := helmRender(map[string]any{"profile": "hardened", "dispatcher": map[string]any{"egress": map[string]any{"hooks": []any{hook}}}}, defaultRelease)
	if err != nil {
		t.Fatal(err)
	}
	if p := dispatcherEgress(objs); p == nil || !ipAllowed(p, netip.MustParseAddr("203.0.113.7"), 8443) || ipAllowed(p, netip.MustParseAddr("203.0.113.7"), 8080) {
		t.Errorf("dispatcher.egress.hooks does not add exactly its rule: %v", p)
	}
	objs, err = helmRender(map[string]any{"profile": "hardened", "dispatcher": map[string]any{"egress": map[string]any{"enabled": false}}}, defaultRelease)
	if err != nil {
		t.Fatal(err)
	}
	if p := dispatcherEgress(objs); p != nil {
		t.Error("dispatcher.egress.enabled=false still renders the policy")
	}
	if _, err := helmRender(map[string]any{"dispatcher": map[string]any{"egress": map[string]any{"hoks": []any{}}}}, defaultRelease); err == nil {
		t.Error("a misspelt dispatcher.egress key is accepted")
	}
}

// dispatcherEgress returns the NetworkPolicy with egress rules that
// selects the dispatcher Deployment's pods, or nil.
func dispatcherEgress(objs []map[string]any) map[string]any {
	var pods map[string]any
	for _, o := range objs {
		if str(o, "kind") == "Deployment" && str(o, "metadata", "name") == "metabus-dispatcher" {
			pods = mapping(o, "spec", "template", "metadata", "labels")
		}
	}
	for _, o := range objs {
		if str(o, "kind") != "NetworkPolicy" || !selects(mapping(o, "spec", "podSelector", "matchLabels"), pods) {
			continue
		}
		for _, pt := range stringList(slice(o, "spec", "policyTypes")) {
			if pt == "Egress" {
				return o
			}
		}
	}
	return nil
}

// selects reports whether matchLabels selects a pod labelled labels (an
// empty selector selects every pod).
func selects(matchLabels, labels map[string]any) bool {
	for k, v := range matchLabels {
		if labels[k] != v {
			return false
		}
	}
	return labels != nil
}

// portsOf returns a rule's port numbers (nil: every port).
func portsOf(rule map[string]any) []int {
	var out []int
	for _, p := range slice(rule, "ports") {
		p, _ := p.(map[string]any)
		var n int
		if _, err := fmt.Sscan(fmt.Sprint(p["port"]), &n); err == nil {
			out = append(out, n)
		}
	}
	return out
}

// ipAllowed evaluates a NetworkPolicy's egress rules for a destination
// outside the cluster's pods: only ipBlock peers (and rules without peers)
// can match it.
func ipAllowed(policy map[string]any, addr netip.Addr, port int) bool {
	for _, rule := range slice(policy, "spec", "egress") {
		rule, _ := rule.(map[string]any)
		ports := portsOf(rule)
		portOK := len(ports) == 0
		for _, p := range ports {
			portOK = portOK || p == port
		}
		if !portOK {
			continue
		}
		peers := slice(rule, "to")
		if len(peers) == 0 {
			return true
		}
		for _, peer := range peers {
			peer, _ := peer.(map[string]any)
			block := mapping(peer, "ipBlock")
			if block == nil {
				continue
			}
			cidr, err := netip.ParsePrefix(str(block, "cidr"))
			if err != nil || !cidr.Contains(addr) {
				continue
			}
			excluded := false
			for _, e := range stringList(slice(block, "except")) {
				if ex, err := netip.ParsePrefix(e); err == nil && ex.Contains(addr) {
					excluded = true
				}
			}
			if !excluded {
				return true
			}
		}
	}
	return false
}
