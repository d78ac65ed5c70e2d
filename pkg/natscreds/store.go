package natscreds

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metabus/metabus/pkg/kubeapi"
)

var secretsGVR = corev1.SchemeGroupVersion.WithResource("secrets")

// attempts bounds how often Run re-reads and re-plans after a write lost a
// race (AlreadyExists, Conflict): the NATS pods start together and each
// runs the generator, so the first attempt of all but one may lose.
const attempts = 8

// Store reads and writes the credential Secrets of one namespace. It only
// GETs them by name (the generator's Role may get those names only, not
// list the namespace's Secrets), creates and updates.
type Store struct {
	Kube      *kubeapi.Client
	Namespace string
}

// Read returns the Secrets among names that exist, by name.
func (s Store) Read(ctx context.Context, names []string) (map[string]Secret, error) {
	have := map[string]Secret{}
	for _, name := range names {
		var sec corev1.Secret
		err := s.Kube.Get(ctx, &sec, kubeapi.Path(secretsGVR, s.Namespace, name, "")...)
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return nil, s.explain(fmt.Errorf("read Secret %s/%s: %w", s.Namespace, name, err))
		}
		have[name] = Secret{Name: name, Labels: sec.Labels, Data: sec.Data, Type: string(sec.Type), ResourceVersion: sec.ResourceVersion}
	}
	return have, nil
}

// Do makes one planned write. An update is conditional on the
// ResourceVersion the plan read.
func (s Store) Do(ctx context.Context, a Action) error {
	sec := corev1.Secret{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{
			Name: a.Secret.Name, Namespace: s.Namespace, Labels: a.Secret.Labels,
			ResourceVersion: a.Secret.ResourceVersion,
		},
		Type: corev1.SecretTypeOpaque,
		Data: a.Secret.Data,
	}
	if a.Secret.Type != "" {
		sec.Type = corev1.SecretType(a.Secret.Type)
	}
	var err error
	switch a.Verb {
	case Create:
		sec.ResourceVersion = ""
		err = s.Kube.Create(ctx, kubeapi.Path(secretsGVR, s.Namespace, "", ""), &sec, nil)
	case Update:
		if sec.ResourceVersion == "" {
			return fmt.Errorf("update Secret %s/%s without a resourceVersion", s.Namespace, a.Secret.Name)
		}
		err = s.Kube.Update(ctx, kubeapi.Path(secretsGVR, s.Namespace, a.Secret.Name, ""), &sec, nil)
	default:
		return fmt.Errorf("unknown verb %q", a.Verb)
	}
	if err != nil {
		return s.explain(fmt.Errorf("%s Secret %s/%s: %w", a.Verb, s.Namespace, a.Secret.Name, err))
	}
	return nil
}

// explain adds what an admin needs to know to a refused request.
func (s Store) explain(err error) error {
	if apierrors.IsForbidden(err) {
		return fmt.Errorf("%w (the generator needs get, create and update on these Secrets in namespace %s: "+
			"the Role metabus-credentials of deploy/rbac/credentials.yaml)", err, s.Namespace)
	}
	return err
}

// raced reports a write that lost to a concurrent one: re-read and plan
// again.
func raced(err error) bool { return apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err) }

// Run makes the credentials of services complete in the store's namespace
// (Ensure) and returns the writes it made; none when everything was in
// place. A write that loses a race with another generator is retried on a
// fresh read, so concurrent runs agree on one seed per service.
func Run(ctx context.Context, store Store, services []string, newSeed NewSeed) ([]Action, error) {
	return converge(ctx, store, Names(services), func(have map[string]Secret) ([]Action, error) {
		return Ensure(services, have, newSeed)
	})
}

// RunTLS makes the NATS TLS material complete in the store's namespace
// (EnsureTLS), as Run does the seeds: concurrent runs agree on one CA, and
// existing Secrets are never replaced.
func RunTLS(ctx context.Context, store Store, spec TLSSpec) ([]Action, error) {
	return converge(ctx, store, TLSNames(spec.Users), func(have map[string]Secret) ([]Action, error) {
		return EnsureTLS(spec, have)
	})
}

// converge reads the Secrets names, plans and makes the writes, and starts
// over on a fresh read when a write lost a race (another generator wrote
// first), until a plan is written whole or a write fails otherwise.
func converge(ctx context.Context, store Store, names []string, plan func(map[string]Secret) ([]Action, error)) ([]Action, error) {
	var done []Action
	for try := 1; ; try++ {
		have, err := store.Read(ctx, names)
		if err != nil {
			return done, err
		}
		actions, err := plan(have)
		if err != nil {
			return done, err
		}
		lost := false
		for _, a := range actions {
			if err := store.Do(ctx, a); err != nil {
				if raced(err) && try < attempts {
					lost = true
					break
				}
				return done, err
			}
			done = append(done, a)
		}
		if !lost {
			return done, nil
		}
		if err := pause(ctx, try); err != nil {
			return done, err
		}
	}
}

// RunRotate gives svc a new seed and then brings the users Secret in line
// (Run). If it stops in between, the next Run (every NATS pod start runs
// one) derives the new public key from the new seed.
func RunRotate(ctx context.Context, store Store, services []string, svc string, newSeed NewSeed) ([]Action, error) {
	for try := 1; ; try++ {
		have, err := store.Read(ctx, []string{SeedSecret(svc)})
		if err != nil {
			return nil, err
		}
		a, err := RotateSeed(services, svc, have, newSeed)
		if err != nil {
			return nil, err
		}
		err = store.Do(ctx, a)
		if raced(err) && try < attempts {
			if err := pause(ctx, try); err != nil {
				return nil, err
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		rest, err := Run(ctx, store, services, newSeed)
		return append([]Action{a}, rest...), err
	}
}

// pause waits a little longer after each lost race.
func pause(ctx context.Context, try int) error {
	t := time.NewTimer(time.Duration(try) * 50 * time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return errors.Join(ctx.Err(), errors.New("credentials: gave up after lost races"))
	case <-t.C:
		return nil
	}
}
