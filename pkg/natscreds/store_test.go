package natscreds

import (
	"context"
	"crypto/x509"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metabus/metabus/internal/testing/kubeenv"
	"github.com/metabus/metabus/pkg/kubeapi"
)

// TestRunAgainstAPIServer: the I/O half against a real API server. Three
// generators racing on a fresh namespace (the three NATS pods start
// together) agree on one seed per service; a run that died after writing
// one seed is completed by the next; a seed that is not a seed is left
// alone and reported.
func TestRunAgainstAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a real kube-apiserver")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	env, err := kubeenv.Start(ctx, kubeenv.Options{NoControllerManager: true, Log: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	kube, err := kubeapi.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	namespace := func(t *testing.T, name string) Store {
		t.Helper()
		err := kube.Create(ctx, kubeapi.Path(corev1.SchemeGroupVersion.WithResource("namespaces"), "", "", ""),
			&corev1.Namespace{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"}, ObjectMeta: metav1.ObjectMeta{Name: name}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return Store{Kube: kube, Namespace: name}
	}
	consistent := func(t *testing.T, s Store) map[string]Secret {
		t.Helper()
		have, err := s.Read(ctx, Names(Services))
		if err != nil {
			t.Fatal(err)
		}
		for _, svc := range Services {
			pub, err := PublicKey(have[SeedSecret(svc)].Data[SeedKey])
			if err != nil || string(have[UsersSecret].Data[UserKey(svc)]) != pub {
				t.Errorf("%s: users key %q, seed's public key %q (%v)", svc, have[UsersSecret].Data[UserKey(svc)], pub, err)
			}
		}
		return have
	}

	t.Run("concurrent generators agree", func(t *testing.T) {
		s := namespace(t, "race")
		var wg sync.WaitGroup
		errs := make([]error, 3)
		for i := range errs {
			wg.Go(func() { _, errs[i] = Run(ctx, s, Services, GenerateSeed) })
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("generator %d: %v", i, err)
			}
		}
		before := consistent(t, s)
		done, err := Run(ctx, s, Services, GenerateSeed)
		if err != nil || len(done) != 0 {
			t.Errorf("a run after them wrote %v (%v), want nothing", done, err)
		}
		for name, sec := range consistent(t, s) {
			if sec.ResourceVersion != before[name].ResourceVersion {
				t.Errorf("%s rewritten", name)
			}
		}
	})

	t.Run("a run that died half way is completed", func(t *testing.T) {
		s := namespace(t, "half")
		seed, _ := GenerateSeed()
		if err := s.Do(ctx, Action{Verb: Create, Secret: Secret{Name: SeedSecret("dispatcher"), Data: map[string][]byte{SeedKey: seed}}}); err != nil {
			t.Fatal(err)
		}
		if _, err := Run(ctx, s, Services, GenerateSeed); err != nil {
			t.Fatal(err)
		}
		have := consistent(t, s)
		if string(have[SeedSecret("dispatcher")].Data[SeedKey]) != string(seed) {
			t.Error("the existing seed was replaced")
		}
	})

	t.Run("a broken seed is reported, not replaced", func(t *testing.T) {
		s := namespace(t, "broken")
		if err := s.Do(ctx, Action{Verb: Create, Secret: Secret{Name: SeedSecret("watcher"), Data: map[string][]byte{SeedKey: []byte("hello")}}}); err != nil {
			t.Fatal(err)
		}
		if _, err := Run(ctx, s, Services, GenerateSeed); err == nil {
			t.Fatal("Run accepted a seed Secret holding no seed")
		}
		have, err := s.Read(ctx, Names(Services))
		if err != nil {
			t.Fatal(err)
		}
		if string(have[SeedSecret("watcher")].Data[SeedKey]) != "hello" || len(have) != 1 {
			t.Errorf("Run wrote despite the error: %v", have)
		}
	})

	t.Run("rotate replaces one seed and its public key", func(t *testing.T) {
		s := namespace(t, "rotate")
		if _, err := Run(ctx, s, Services, GenerateSeed); err != nil {
			t.Fatal(err)
		}
		before := consistent(t, s)
		if _, err := RunRotate(ctx, s, Services, "revisions", GenerateSeed); err != nil {
			t.Fatal(err)
		}
		after := consistent(t, s)
		for _, svc := range Services {
			changed := string(after[SeedSecret(svc)].Data[SeedKey]) != string(before[SeedSecret(svc)].Data[SeedKey])
			if changed != (svc == "revisions") {
				t.Errorf("%s seed changed: %v", svc, changed)
			}
		}
	})

	t.Run("TLS: concurrent generators agree on one CA, a second run writes nothing", func(t *testing.T) {
		s := namespace(t, "tls")
		spec := testSpec(time.Now())
		var wg sync.WaitGroup
		errs := make([]error, 3)
		for i := range errs {
			wg.Go(func() { _, errs[i] = RunTLS(ctx, s, spec) })
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("generator %d: %v", i, err)
			}
		}
		before, err := s.Read(ctx, TLSNames(spec.Users))
		if err != nil {
			t.Fatal(err)
		}
		if len(before) != len(TLSNames(spec.Users)) {
			t.Fatalf("Secrets %d, want %d", len(before), len(TLSNames(spec.Users)))
		}
		for _, name := range TLSNames(spec.Users)[1:] {
			verify(t, before, name, "", x509.ExtKeyUsageClientAuth)
			if before[name].Type != "kubernetes.io/tls" {
				t.Errorf("%s: type %q", name, before[name].Type)
			}
		}
		verify(t, before, ServerTLSSecret, "nats.metabus.svc", x509.ExtKeyUsageServerAuth)
		done, err := RunTLS(ctx, s, spec)
		if err != nil || len(done) != 0 {
			t.Errorf("a run after them wrote %v (%v), want nothing", done, err)
		}
		after, err := s.Read(ctx, TLSNames(spec.Users))
		if err != nil {
			t.Fatal(err)
		}
		for name, sec := range after {
			if sec.ResourceVersion != before[name].ResourceVersion {
				t.Errorf("%s rewritten", name)
			}
		}
	})
}
