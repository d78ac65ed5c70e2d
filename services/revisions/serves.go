package revisions

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/revstore"
)

// A request's parent must belong to a controller the requesting stage
// serves, or a holder of a dispatcher's or applier's NATS credentials could
// read, forge or delete the ControllerRevisions of any parent of any
// namespace through this service's cluster-wide rights.
//
// "Serves" is defined by what the service can check without trusting the
// request: the controller it names is a CompositeController (the only kind
// with revisions) that exists in the API server, with the UID the request
// carries when it carries one, and whose spec.parentResource names the
// parent's API group and resource. The requester's identity is not
// checked here: NATS does not tell a responder who published a request;
// the shipped permissions let only the dispatcher and applier users
// publish on the revisions subject.

// controllerTTL is how long a controller read is reused: a request costs
// no API call beyond its own while a controller is busy, and a changed or
// deleted controller is seen within this delay.
const controllerTTL = 10 * time.Second

// serves returns nil when the CompositeController c (nil: it does not
// exist) serves parent p as ref names it, else why not.
func serves(c *v1alpha1.CompositeController, ref bus.ControllerRef, p revstore.Parent) error {
	switch {
	case ref.Kind != v1alpha1.CompositeControllerKind:
		return fmt.Errorf("controller kind %q has no revisions: only a %s does", ref.Kind, v1alpha1.CompositeControllerKind)
	case ref.Name == "":
		return fmt.Errorf("the request names no controller")
	case c == nil:
		return fmt.Errorf("no %s %q exists", v1alpha1.CompositeControllerKind, ref.Name)
	case ref.UID != "" && string(c.UID) != ref.UID:
		return fmt.Errorf("%s %q has UID %s, not the request's %s", v1alpha1.CompositeControllerKind, ref.Name, c.UID, ref.UID)
	}
	pr := c.Spec.ParentResource
	wantGroup, wantResource := apiGroup(pr.APIVersion), strings.SplitN(pr.Resource, "/", 2)[0]
	if apiGroup(p.APIVersion) != wantGroup || p.Resource != wantResource {
		return fmt.Errorf("%s %q serves %s, not the parent's %s", v1alpha1.CompositeControllerKind, ref.Name,
			groupResource(wantGroup, wantResource), groupResource(apiGroup(p.APIVersion), p.Resource))
	}
	return nil
}

func apiGroup(apiVersion string) string {
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		return apiVersion // compared, never equal to a valid one's group
	}
	return gv.Group
}

func groupResource(group, resource string) string {
	return schema.GroupResource{Group: group, Resource: resource}.String()
}

// controllers reads CompositeControllers for serves, each reused for
// controllerTTL; a controller that does not exist is read again on the
// next request, so a new one is served at once.
type controllers struct {
	dyn dynamic.Interface
	now func() time.Time

	mu    sync.Mutex
	cache map[string]cachedController
}

type cachedController struct {
	c    *v1alpha1.CompositeController
	read time.Time
}

func newControllers(dyn dynamic.Interface) *controllers {
	return &controllers{dyn: dyn, now: time.Now, cache: map[string]cachedController{}}
}

// get returns the CompositeController name, nil when it does not exist.
func (cs *controllers) get(ctx context.Context, name string) (*v1alpha1.CompositeController, error) {
	cs.mu.Lock()
	hit, ok := cs.cache[name]
	cs.mu.Unlock()
	if ok && cs.now().Sub(hit.read) < controllerTTL {
		return hit.c, nil
	}
	u, err := cs.dyn.Resource(v1alpha1.CompositeControllerGVR).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		cs.mu.Lock()
		delete(cs.cache, name)
		cs.mu.Unlock()
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s %s: %w", v1alpha1.CompositeControllerKind, name, err)
	}
	var c v1alpha1.CompositeController
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &c); err != nil {
		return nil, fmt.Errorf("decode %s %s: %w", v1alpha1.CompositeControllerKind, name, err)
	}
	cs.mu.Lock()
	cs.cache[name] = cachedController{c: &c, read: cs.now()}
	cs.mu.Unlock()
	return &c, nil
}

// checkServes answers a request whose parent is not one its controller
// serves (Invalid) or whose controller cannot be read (Error); nil lets it
// through.
func (s *Service) checkServes(ctx context.Context, req revstore.Request) *revstore.Response {
	var c *v1alpha1.CompositeController
	if req.Controller.Kind == v1alpha1.CompositeControllerKind && req.Controller.Name != "" {
		var err error
		if c, err = s.controllers.get(ctx, req.Controller.Name); err != nil {
			return failed("%v", err)
		}
	}
	if err := serves(c, req.Controller, req.Parent); err != nil {
		return invalid("parent %s does not belong to the controller the request names: %v", parentKey(req.Parent), err)
	}
	return nil
}
