// Package kubeapi reads and writes the few built-in Kubernetes objects
// metabus handles itself (Events, the watcher's Lease, the Secrets and
// ConfigMaps webhooks reference, discovery documents) as plain JSON through
// one REST client.
//
// It stands in for client-go's typed clientset. Every typed client imports
// k8s.io/client-go/kubernetes/scheme, which links and registers every
// k8s.io/api group at init: about 9 MB more RSS per process, for a handful
// of calls on three kinds. The k8s.io/api structs themselves cost nothing
// of the sort (only the all-groups scheme and the clients do), so requests
// and answers are those structs, encoded with encoding/json.
package kubeapi

import (
	"context"
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
)

// Client makes JSON requests to the API server. Its errors are the REST
// client's, unwrapped: a failed request is the API server's
// *apierrors.StatusError (apierrors.IsNotFound, IsConflict... work, and so
// do the type switches client-go's event recorder makes), a transport
// failure is the transport's error. Callers add the context.
type Client struct {
	rc rest.Interface
}

// New returns a client over rc, which must speak JSON and decode error
// answers into metav1.Status as NewForConfig's does.
func New(rc rest.Interface) *Client { return &Client{rc: rc} }

// NewForConfig returns a client with the dynamic client's settings (JSON,
// Status errors decoded) and a rate limiter of its own from cfg.
func NewForConfig(cfg *rest.Config) (*Client, error) {
	rc, err := NewREST(cfg)
	if err != nil {
		return nil, err
	}
	return New(rc), nil
}

// NewREST returns a REST client with the dynamic client's settings: JSON
// in and out, no scheme of typed objects, error answers decoded into the
// API server's Status.
func NewREST(cfg *rest.Config) (rest.Interface, error) {
	rc, err := rest.UnversionedRESTClientFor(dynamic.ConfigFor(cfg))
	if err != nil {
		return nil, fmt.Errorf("REST client for %s: %w", cfg.Host, err)
	}
	return rc, nil
}

// REST returns the underlying REST client, for requests the helpers below
// do not cover (extra headers, answers read raw).
func (c *Client) REST() rest.Interface { return c.rc }

// Path is the URL path of a resource's collection (name ""), of one object,
// or of an object's subresource (subresource not ""): the layout the
// dynamic client uses.
func Path(gvr schema.GroupVersionResource, namespace, name, subresource string) []string {
	p := make([]string, 0, 8)
	if gvr.Group == "" {
		p = append(p, "/api", gvr.Version)
	} else {
		p = append(p, "/apis", gvr.Group, gvr.Version)
	}
	if namespace != "" {
		p = append(p, "namespaces", namespace)
	}
	p = append(p, gvr.Resource)
	if name != "" {
		p = append(p, name)
	}
	if subresource != "" {
		p = append(p, subresource)
	}
	return p
}

// Answer is the body of a request's answer, or its error as the typed API
// error (Forbidden, Conflict...): Result.Raw returns a failed request's
// error without decoding the Status in its body, so a 403 would read as an
// "unknown" error.
func Answer(res rest.Result) ([]byte, error) {
	if err := res.Error(); err != nil {
		return nil, err
	}
	return res.Raw()
}

// Get GETs the object or document at path into into.
func (c *Client) Get(ctx context.Context, into any, path ...string) error {
	return decode(c.rc.Get().AbsPath(path...).Do(ctx), into)
}

// Create POSTs obj to the collection at path and decodes the created object
// into into.
func (c *Client) Create(ctx context.Context, path []string, obj, into any) error {
	return c.send(ctx, c.rc.Post(), path, obj, into)
}

// Update PUTs obj at path and decodes the answer into into. A
// metadata.resourceVersion in obj makes the write conditional: the API
// server answers Conflict if the object changed since.
func (c *Client) Update(ctx context.Context, path []string, obj, into any) error {
	return c.send(ctx, c.rc.Put(), path, obj, into)
}

// Patch applies patch, of type pt, to the object at path and decodes the
// answer into into.
func (c *Client) Patch(ctx context.Context, path []string, pt types.PatchType, patch []byte, into any) error {
	return decode(c.rc.Patch(pt).AbsPath(path...).Body(patch).Do(ctx), into)
}

func (c *Client) send(ctx context.Context, req *rest.Request, path []string, obj, into any) error {
	body, err := json.Marshal(obj)
	if err != nil {
		return fmt.Errorf("encode the request body: %w", err)
	}
	return decode(req.AbsPath(path...).SetHeader("Content-Type", "application/json").Body(body).Do(ctx), into)
}

// decode reads res into into (nil: the answer is not read).
func decode(res rest.Result, into any) error {
	raw, err := Answer(res)
	if err != nil || into == nil {
		return err
	}
	if err := json.Unmarshal(raw, into); err != nil {
		return fmt.Errorf("decode the API server's answer: %w", err)
	}
	return nil
}
