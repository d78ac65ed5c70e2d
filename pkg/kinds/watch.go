package kinds

// Watching is what the watcher needs from a kind: its parent sources,
// owned (and possibly adopted) sources, how parents are selected, and how
// a snapshot of one parent is assembled.
type Watching interface {
}
