package informers

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/metabus/metabus/internal/testing/kubeenv"
)

// env is the control plane shared by the package's tests; nil with -short.
var env *kubeenv.Env

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	e, err := kubeenv.Start(ctx, kubeenv.Options{NoControllerManager: true})
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "informers tests: start control plane: %v\n", err)
		os.Exit(1)
	}
	env = e
	code := m.Run()
	if err := env.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "informers tests: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

func requireEnv(t *testing.T) {
	t.Helper()
	if env == nil {
		t.Skip("needs a real kube-apiserver; skipped with -short")
	}
}
