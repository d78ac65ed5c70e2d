package kinds

// Applying is what the applier needs from a kind: the rules and owner of
// its children, adoption, the writes on the parent itself (status, labels,
// annotations, finalizer), and whether it rolls out.
type Applying interface {
}
