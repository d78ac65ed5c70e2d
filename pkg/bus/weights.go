package bus

import (
	"fmt"
	"strings"
)

// WeightPolicy is the operator's bound on the weights controllers' authors
// ask for with WeightAnnotation. The annotation is the author's; the share
// of a replica it buys is the operator's to allow: without a bound, an
// author's few controllers at weight MaxWeight take turns a hundred times as
// often as everyone else's when a replica is saturated.
type WeightPolicy struct {
	// Max bounds every granted weight (1: every annotation is ignored);
	// 0 means MaxWeight.
	Max int
	// Allowed, when not nil, names the controllers (ControllerID) whose
	// annotation counts at all; every other controller gets weight 1.
	Allowed map[string]bool
}

// Grant is the weight controller ctrlID is given when its annotation asks
// for asked: at least 1, at most the policy's Max, and 1 for a controller
// the allow-list does not name.
func (p WeightPolicy) Grant(ctrlID string, asked int) int {
	if asked <= 1 || (p.Allowed != nil && !p.Allowed[ctrlID]) {
		return 1
	}
	limit := p.Max
	if limit <= 0 || limit > MaxWeight {
		limit = MaxWeight
	}
	return min(asked, limit)
}

// ParseMaxWeight reads the operator's bound on weights: an integer from 1
// to MaxWeight.
func ParseMaxWeight(v string) (int, error) {
	var w int
	if _, err := fmt.Sscan(strings.TrimSpace(v), &w); err != nil || w < 1 || w > MaxWeight ||
		strings.TrimSpace(v) != fmt.Sprint(w) {
		return 0, fmt.Errorf("maximum controller weight %q: want an integer from 1 to %d", v, MaxWeight)
	}
	return w, nil
}

// ParseWeightedControllers reads a comma-separated list of controllers,
// each <kind>/<name> with kind CompositeController or DecoratorController,
// into their ControllerIDs.
func ParseWeightedControllers(v string) ([]string, error) {
	var ids []string
	for _, e := range strings.Split(v, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		kind, name, ok := strings.Cut(e, "/")
		if !ok || name == "" || strings.Contains(name, "/") ||
			(kind != "CompositeController" && kind != "DecoratorController") {
			return nil, fmt.Errorf("weighted controller %q: want CompositeController/<name> or DecoratorController/<name>", e)
		}
		ids = append(ids, ControllerID(kind, name))
	}
	return ids, nil
}
