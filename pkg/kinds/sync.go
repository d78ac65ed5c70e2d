package kinds

// Syncing is what the dispatcher needs from a kind: which hook a parent
// gets, the hook request(s) built from a snapshot, and how the answers
// become one desired state.
type Syncing interface {
}
