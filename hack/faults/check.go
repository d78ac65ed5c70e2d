package main

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
)

// The invariants, in the order they are reported.
const (
	invConverged  = "parents converged (status = what the hook wants for the current spec)"
	invOneChild   = "exactly one child per parent, controlled by the current parent UID"
	invContent    = "child content = what the hook wants"
	invOrphans    = "no orphaned children after GC"
	invFinalizers = "no finalizer left behind (no parent stuck in deletion)"
	invDLQ        = "MC_DLQ empty"
	invExits      = "no process exited that the suite did not kill"
	invShutdown   = "services stop cleanly on SIGTERM"
	invReplaced   = "no child replaced needlessly (one ConfigMap per parent incarnation)"
	invOrder      = "no desired state applied out of order (per parent: the gen its child and status show, and the generation its status.observedGeneration records, never go back; its writes apply nondecreasing work sequences)"
	invRejoin     = "NATS nodes rejoin and catch up (every node current within 3m of each NATS fault, and at the end)"
)

var invariants = []string{invConverged, invOneChild, invContent, invOrphans, invFinalizers, invDLQ, invExits, invShutdown, invReplaced, invOrder, invRejoin}

// violations maps an invariant to its violations (one line each).
type violations map[string][]string

func (v violations) add(inv, format string, args ...any) {
	v[inv] = append(v[inv], fmt.Sprintf(format, args...))
}

func (v violations) count(invs ...string) int {
	n := 0
	for _, inv := range invs {
		n += len(v[inv])
	}
	return n
}

// clusterState is what the checker reads from the API server.
type clusterState struct {
	parents  int
	children int
}

// checkCluster checks the invariants that the API server shows: parents,
// their children, orphans and finalizers.
func checkCluster(ctx context.Context, dyn dynamic.Interface, v violations, explain func(name string) string) (clusterState, error) {
	var st clusterState
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	parents, err := dyn.Resource(parentGVR).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return st, fmt.Errorf("list parents: %w", err)
	}
	cms, err := dyn.Resource(cmGVR).Namespace(ns).List(ctx, metav1.ListOptions{LabelSelector: parentLabel})
	if err != nil {
		return st, fmt.Errorf("list children: %w", err)
	}
	st.parents, st.children = len(parents.Items), len(cms.Items)

	byOwner := map[types.UID][]*unstructured.Unstructured{}
	byName := map[string]*unstructured.Unstructured{}
	for i := range cms.Items {
		cm := &cms.Items[i]
		byName[cm.GetName()] = cm
		if ref := metav1.GetControllerOfNoCopy(cm); ref != nil {
			byOwner[ref.UID] = append(byOwner[ref.UID], cm)
		}
	}
	live := map[types.UID]bool{}
	for i := range parents.Items {
		p := &parents.Items[i]
		live[p.GetUID()] = true
		name := p.GetName()
		if ts := p.GetDeletionTimestamp(); ts != nil {
			why := ""
			if explain != nil {
				why = "; " + explain(name)
			}
			v.add(invFinalizers, "%s (uid %s) deleted at %s, still there with finalizers %v%s", name, p.GetUID(), ts.UTC().Format("15:04:05"), p.GetFinalizers(), why)
			continue
		}
		for _, f := range p.GetFinalizers() {
			if f != finalizer {
				v.add(invFinalizers, "%s carries an unexpected finalizer %q", name, f)
			}
		}
		gen, _, _ := unstructured.NestedInt64(p.Object, "spec", "gen")
		val, _, _ := unstructured.NestedString(p.Object, "spec", "value")
		status, _, _ := unstructured.NestedMap(p.Object, "status")
		var problems []string
		if got, ok := status["observedGen"].(int64); !ok || got != gen {
			problems = append(problems, fmt.Sprintf("observedGen %v, want %d", status["observedGen"], gen))
		}
		if got, _ := status["value"].(string); got != val {
			problems = append(problems, fmt.Sprintf("value %q, want %q", got, val))
		}
		if got, ok := status["childCount"].(int64); !ok || got != 1 {
			problems = append(problems, fmt.Sprintf("childCount %v, want 1", status["childCount"]))
		}
		if got, ok := status["observedGeneration"].(int64); !ok || got != p.GetGeneration() {
			problems = append(problems, fmt.Sprintf("observedGeneration %v, want %d", status["observedGeneration"], p.GetGeneration()))
		}
		if len(problems) > 0 {
			why := ""
			if explain != nil {
				why = "; " + explain(name)
			}
			v.add(invConverged, "%s (uid %s, gen %d, spec written %s): %s%s", name, p.GetUID(), gen, specTime(p), strings.Join(problems, ", "), why)
		}

		owned := byOwner[p.GetUID()]
		switch {
		case len(owned) == 0:
			if cm := byName[name]; cm != nil {
				v.add(invOneChild, "%s (uid %s): no child; ConfigMap %s is controlled by %s", name, p.GetUID(), name, ownerString(cm))
			} else {
				v.add(invOneChild, "%s (uid %s): no child", name, p.GetUID())
			}
			continue
		case len(owned) > 1:
			var names []string
			for _, cm := range owned {
				names = append(names, cm.GetName())
			}
			v.add(invOneChild, "%s (uid %s): %d children %v", name, p.GetUID(), len(owned), names)
		}
		for _, cm := range owned {
			data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
			if cm.GetName() != name || data["gen"] != strconv.FormatInt(gen, 10) || data["value"] != val || cm.GetLabels()[parentLabel] != name {
				v.add(invContent, "%s (gen %d, value %q): child %s has data %v, labels %v", name, gen, val, cm.GetName(), data, cm.GetLabels())
			}
		}
	}
	for i := range cms.Items {
		cm := &cms.Items[i]
		ref := metav1.GetControllerOfNoCopy(cm)
		if ref == nil || !live[ref.UID] {
			v.add(invOrphans, "ConfigMap %s (uid %s, created %s): %s", cm.GetName(), cm.GetUID(), cm.GetCreationTimestamp().UTC().Format("15:04:05"), ownerString(cm))
		}
	}
	return st, nil
}

// specTime is when the parent's spec was last written (from managedFields).
func specTime(p *unstructured.Unstructured) string {
	var t time.Time
	for _, mf := range p.GetManagedFields() {
		if mf.Subresource == "" && mf.Time != nil && mf.FieldsV1 != nil && strings.Contains(string(mf.FieldsV1.Raw), `"f:spec"`) && mf.Time.After(t) {
			t = mf.Time.Time
		}
	}
	if t.IsZero() {
		return "?"
	}
	return t.UTC().Format("15:04:05")
}

func ownerString(cm *unstructured.Unstructured) string {
	ref := metav1.GetControllerOfNoCopy(cm)
	if ref == nil {
		return "no controllerRef"
	}
	return fmt.Sprintf("controllerRef %s/%s uid %s", ref.Kind, ref.Name, ref.UID)
}

// dlqEntries lists what MC_DLQ holds, one line per message.
func dlqEntries(ctx context.Context, connect func() (*nats.Conn, error)) ([]string, error) {
	nc, err := connect()
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, "MC_DLQ")
	if err != nil {
		return nil, fmt.Errorf("MC_DLQ: %w", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("MC_DLQ: %w", err)
	}
	var out []string
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0 && len(out) < 50; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			continue
		}
		out = append(out, fmt.Sprintf("seq %d %s (from %s, %s deliveries, reason %q) at %s: %.300s", seq, m.Subject,
			m.Header.Get("Metabus-Original-Subject"), m.Header.Get("Metabus-Deliveries"), m.Header.Get("Metabus-Dead-Reason"),
			m.Time.UTC().Format("15:04:05"), string(m.Data)))
	}
	if n := int(info.State.Msgs); n > len(out) {
		out = append(out, fmt.Sprintf("... %d messages in all", n))
	}
	return out, nil
}

// sorted returns a copy of xs, sorted.
func sorted(xs []string) []string {
	out := append([]string(nil), xs...)
	sort.Strings(out)
	return out
}

func jsConnect(url string) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(url, nats.Timeout(5*time.Second), nats.NoReconnect())
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}
