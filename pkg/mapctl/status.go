package mapctl

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"unicode"

	"github.com/metabus/metabus/pkg/snapshot"
)

// Status fields metabus owns on a MapController's parents.
const (
	StatusObservedGeneration = "observedGeneration"
	StatusInputs             = "inputs"
	StatusOutputs            = "outputs"
	// statusTotal is the count of every object of a resource; a condition
	// whose name would collide with it is not reported.
	statusTotal = "total"
)

// Observed is what a parent's aggregated status is computed from.
type Observed struct {
	// Generation is the parent's metadata.generation.
	Generation int64
	// Inputs are the parent's selected inputs, one group per input
	// resource in spec order (every resource, even with no inputs).
	Inputs []snapshot.Group
	// Outputs are the outputs the parent controls, one group per output
	// resource in spec order, of every key (and untagged ones: they are
	// the parent's too).
	Outputs []snapshot.Group
}

// Aggregate computes the status fields metabus owns on the parent (no
// hook: a map hook sees one input and cannot know the whole):
//
//	observedGeneration: <parent's generation>
//	inputs:
//	  <resource>: {total: <n>}
//	outputs:
//	  <resource>: {total: <n>, <condition>: <n>, ...}
//
// Every declared resource appears, with total 0 when it has no objects.
// Resources are named by their plural; two of one list sharing a plural
// (in different groups) are named <plural>.<group> instead, so neither
// hides the other. For each condition type found in the outputs'
// status.conditions, <condition> is the type in lowerCamelCase
// (ConditionName) and its value the number of outputs with that condition
// "True" (0 when the type is only ever False or Unknown). Numbers are
// int64, as JSON decoding yields them, so the result compares equal to a
// status read back from the API.
func Aggregate(o Observed) map[string]any {
	inputs := map[string]any{}
	names := resourceNames(o.Inputs)
	for i, g := range o.Inputs {
		inputs[names[i]] = map[string]any{statusTotal: int64(len(g.Objects))}
	}
	outputs := map[string]any{}
	names = resourceNames(o.Outputs)
	for i, g := range o.Outputs {
		outputs[names[i]] = outputCounts(g)
	}
	return map[string]any{
		StatusObservedGeneration: o.Generation,
		StatusInputs:             inputs,
		StatusOutputs:            outputs,
	}
}

// resourceNames names each group's status entry (see Aggregate).
func resourceNames(groups []snapshot.Group) []string {
	count := map[string]int{}
	for _, g := range groups {
		count[g.Resource]++
	}
	names := make([]string, len(groups))
	for i, g := range groups {
		names[i] = g.Resource
		if count[g.Resource] > 1 {
			if group := apiGroup(g.APIVersion); group != "" {
				names[i] = g.Resource + "." + group
			}
		}
	}
	return names
}

// outputCounts counts one output resource's objects and their conditions.
// An output counts once per condition name even when several of its
// condition types map to that name (Ready and ready): the name is what
// the status reports.
func outputCounts(g snapshot.Group) map[string]any {
	counts := map[string]any{statusTotal: int64(len(g.Objects))}
	for _, o := range g.Objects {
		if o == nil {
			continue
		}
		status, _ := o.Object["status"].(map[string]any)
		conds, _ := status["conditions"].([]any)
		trueNames := map[string]bool{}
		for _, c := range conds {
			cm, _ := c.(map[string]any)
			typ, _ := cm["type"].(string)
			name := ConditionName(typ)
			if name == "" || name == statusTotal {
				continue
			}
			if _, found := counts[name]; !found {
				counts[name] = int64(0)
			}
			if st, _ := cm["status"].(string); st == "True" {
				trueNames[name] = true
			}
		}
		for name := range trueNames {
			counts[name] = counts[name].(int64) + 1
		}
	}
	return counts
}

// ConditionName is a condition type in lowerCamelCase, the key its count
// has in the status: "Ready" is "ready", "ReadyToUse" "readyToUse",
// "PVCBound" "pvcBound" (a leading initialism is lowered whole), and the
// separators condition types may hold ('.', '-', '_', '/') start a new
// word: "example.com/Synced" is "exampleComSynced". Characters that are
// neither letters nor digits are dropped; "" means the type yields no
// name.
func ConditionName(typ string) string {
	var words [][]rune
	var cur []rune
	for _, r := range typ {
		if unicode.IsLetter(r) || unicode.IsDigit(r) {
			cur = append(cur, r)
			continue
		}
		if len(cur) > 0 {
			words = append(words, cur)
			cur = nil
		}
	}
	if len(cur) > 0 {
		words = append(words, cur)
	}
	var b []rune
	for i, w := range words {
		if i == 0 {
			b = append(b, lowerLead(w)...)
			continue
		}
		b = append(b, unicode.ToUpper(w[0]))
		b = append(b, w[1:]...)
	}
	return string(b)
}

// lowerLead lowers w's leading upper-case run, except the last letter of
// a run that a lower-case letter follows, which starts the next word
// ("PVCBound" gives "pvcBound", "URL" "url", "Ready" "ready").
func lowerLead(w []rune) []rune {
	out := append([]rune(nil), w...)
	for i, r := range out {
		if !unicode.IsUpper(r) {
			break
		}
		if i > 0 && i+1 < len(out) && unicode.IsLower(out[i+1]) {
			break
		}
		out[i] = unicode.ToLower(r)
	}
	return out
}

// MergeStatus returns the parent's status with the fields metabus owns
// (Aggregate's) replaced by computed, and whether that changes anything.
// Other fields are kept: metabus owns only its three, and rewriting the
// rest would fight whoever writes them. inputs and outputs are replaced
// whole, so a resource dropped from the spec leaves the status. The
// comparison is of JSON values (int64 and float64 of one number are equal),
// so a status read back from the API is not taken for a change. current is
// not modified.
func MergeStatus(current, computed map[string]any) (map[string]any, bool, error) {
	merged := maps.Clone(current)
	if merged == nil {
		merged = map[string]any{}
	}
	changed := false
	for _, f := range []string{StatusObservedGeneration, StatusInputs, StatusOutputs} {
		want, ok := computed[f]
		if !ok {
			continue
		}
		same, err := jsonEqual(current[f], want)
		if err != nil {
			return nil, false, fmt.Errorf("compare status.%s: %w", f, err)
		}
		if !same {
			changed = true
		}
		merged[f] = want
	}
	return merged, changed, nil
}

// jsonEqual compares two values as JSON (encoding/json sorts map keys).
func jsonEqual(a, b any) (bool, error) {
	ja, err := json.Marshal(a)
	if err != nil {
		return false, err
	}
	jb, err := json.Marshal(b)
	if err != nil {
		return false, err
	}
	return bytes.Equal(ja, jb), nil
}
