package jsbus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/revstore"
	"github.com/metabus/metabus/pkg/snapshot"
)

// SnapshotClient is a snapshot.Source over NATS request/reply: the
// watcher's snapshot service.
type SnapshotClient struct {
	NC      *nats.Conn
	Timeout time.Duration
}

// Snapshot sends req to the snapshot service.
func (c SnapshotClient) Snapshot(ctx context.Context, req snapshot.Request) (*snapshot.Response, error) {
	var resp snapshot.Response
	if err := RequestJSON(ctx, c.NC, bus.SnapshotSubject, "snapshot", c.Timeout, req, &resp); err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return nil, fmt.Errorf("snapshot request for %s/%s (is the watcher up?): %w", req.Controller.ID(), req.ParentUID, err)
		}
		return nil, fmt.Errorf("snapshot request for %s/%s: %w", req.Controller.ID(), req.ParentUID, err)
	}
	return &resp, nil
}

// RevisionsClient is a revstore.Store over NATS request/reply: the
// revisions service.
type RevisionsClient struct {
	NC      *nats.Conn
	Timeout time.Duration
}

// Revisions sends req to the revisions service.
func (c RevisionsClient) Revisions(ctx context.Context, req revstore.Request) (*revstore.Response, error) {
	var resp revstore.Response
	if err := RequestJSON(ctx, c.NC, bus.RevisionsSubject, "revisions", c.Timeout, req, &resp); err != nil {
		return nil, fmt.Errorf("revisions %s request for %s/%s: %w", req.Op, req.Controller.ID(), req.Parent.UID, err)
	}
	return &resp, nil
}
