// Command devrun is `make run`: it brings metabus up for local development.
// It first asks the current kubeconfig's cluster whether it answers, and
// uses it if so; only otherwise does it build (once per machine, with
// progress) and start a local control plane (etcd, kube-apiserver,
// kube-controller-manager built from Go modules by hack/kubeenv/build.sh).
// Then it installs the CRDs, runs every metabus stage in this process with
// an embedded JetStream server, walks through the HelloWorld tutorial with
// its hook served in-process, printing what happens, and keeps serving
// until Ctrl-C (or exits with --exit-after-demo).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/metabus/metabus/examples/helloworld"
	"github.com/metabus/metabus/internal/allinone"
	"github.com/metabus/metabus/internal/testing/kubeenv"
	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/obs"
)

func main() {
	var (
		local     = flag.Bool("local", false, "always start a local control plane, even if a kubeconfig cluster answers")
		exitAfter = flag.Bool("exit-after-demo", false, "stop after the HelloWorld walkthrough")
		logLevel  = flag.String("zap-log-level", "warn", "metabus log level while the demo runs")
		dataDir   = flag.String("data-dir", ".metabus", "directory for the embedded JetStream store and the local control plane")
	)
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *local, *exitAfter, *logLevel, *dataDir); err != nil {
		fmt.Fprintf(os.Stderr, "make run: %v\n", err)
		os.Exit(1)
	}
}

func say(format string, args ...any) {
	fmt.Printf("==> "+format+"\n", args...)
}

// steps numbers what make run does and says how long each took.
type steps struct {
	n, total int
	start    time.Time
	began    time.Time
}

func (s *steps) next(what string) {
	if s.n > 0 {
		say("    (%s)", time.Since(s.began).Round(100*time.Millisecond))
	} else {
		s.start = time.Now()
	}
	s.n++
	s.began = time.Now()
	say("[%d/%d] %s", s.n, s.total, what)
}

func run(ctx context.Context, forceLocal, exitAfter bool, logLevel, dataDir string) error {
	log, err := obs.NewLogger(obs.LogFlags{Level: logLevel, Encoder: "console"})
	if err != nil {
		return err
	}
	st := &steps{total: 4}
	st.next("asking the current kubeconfig's cluster whether it answers")
	cfg, how := existingCluster()
	if forceLocal {
		cfg, how = nil, "--local given"
	}
	if cfg == nil {
		st.total = 5
		say("no reachable cluster in the current kubeconfig (%s): a local control plane will run", how)
		st.next("finding or building the local control plane (etcd, kube-apiserver, kube-controller-manager)")
		binDir, err := controlPlaneBinaries(ctx)
		if err != nil {
			return err
		}
		st.next("starting the local control plane")
		dir, err := filepath.Abs(filepath.Join(dataDir, "kube"))
		if err != nil {
			return err
		}
		_ = os.RemoveAll(dir)
		if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
			return err
		}
		env, err := kubeenv.Start(ctx, kubeenv.Options{
			BinDir: binDir,
			Dir:    dir,
			CRDs:   []string{"deploy/crds", "examples/helloworld/manifests/crd.yaml"},
			Log:    func(f string, a ...any) { say("    control plane: "+f, a...) },
		})
		if err != nil {
			return err
		}
		defer func() { say("stopping the local control plane"); _ = env.Stop() }()
		cfg = env.Config
		say("local control plane ready, with the metabus and HelloWorld CRDs; use it with: export KUBECONFIG=%s", env.Kubeconfig)
	} else {
		say("using the cluster of the current kubeconfig (%s)", how)
		st.next("installing the metabus CRDs and the HelloWorld CRD")
		if err := kubeenv.ApplyManifests(ctx, cfg, "deploy/crds", "examples/helloworld/manifests/crd.yaml"); err != nil {
			return fmt.Errorf("install CRDs: %w", err)
		}
	}
	st.next("starting metabus (every stage in this process, embedded JetStream)")

	storeDir, err := filepath.Abs(filepath.Join(dataDir, "nats"))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	started := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- allinone.Run(ctx, allinone.Config{StoreDir: storeDir, Listen: "127.0.0.1:4222"}, allinone.Deps{
			REST: cfg, Log: log,
			Started: func(_ *server.Server, url string) { started <- url },
		})
	}()
	select {
	case url := <-started:
		say("metabus is running: watcher, dispatcher and applier in this process, JetStream at %s (store %s)", url, storeDir)
	case err := <-done:
		return fmt.Errorf("metabus: %w", err)
	}

	st.next("HelloWorld walkthrough")
	if err := demo(ctx, cfg, log); err != nil {
		return fmt.Errorf("HelloWorld demo: %w", err)
	}
	say("done in %s", time.Since(st.start).Round(100*time.Millisecond))
	if exitAfter {
		cancel()
		<-done
		return nil
	}
	say("metabus keeps running; try: kubectl -n hello patch helloworld your-name --type=merge -p '{\"spec\":{\"who\":\"Someone\"}}'  (Ctrl-C to stop)")
	select {
	case <-ctx.Done():
		return nil
	case err := <-done:
		return err
	}
}

// existingCluster returns the current kubeconfig's cluster if it answers.
func existingCluster() (*rest.Config, string) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, "no usable kubeconfig"
	}
	cfg = rest.CopyConfig(cfg)
	cfg.Timeout = 3 * time.Second
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err.Error()
	}
	v, err := kube.Discovery().ServerVersion()
	if err != nil {
		return nil, "cluster at " + cfg.Host + " does not answer"
	}
	cfg.Timeout = 0
	cfg.QPS, cfg.Burst = 100, 200
	return cfg, fmt.Sprintf("%s, Kubernetes %s", cfg.Host, v.GitVersion)
}

var (
	podsGVR  = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	helloGVR = schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "helloworlds"}
	nsGVR    = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
)

func manifest(name string) (*unstructured.Unstructured, error) {
	data, err := fs.ReadFile(helloworld.Manifests, "manifests/"+name)
	if err != nil {
		return nil, err
	}
	var obj map[string]any
	if err := yaml.Unmarshal(data, &obj); err != nil {
		return nil, fmt.Errorf("parse %s: %w", name, err)
	}
	return &unstructured.Unstructured{Object: obj}, nil
}

// demo walks through the tutorial and prints what metabus did.
func demo(ctx context.Context, cfg *rest.Config, log *zap.Logger) error {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	// The hook: the tutorial's sync(), served in this process.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: helloworld.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	go func() { <-ctx.Done(); _ = srv.Close() }()
	hookURL := "http://" + ln.Addr().String() + "/sync"
	say("HelloWorld sync hook serving at %s", hookURL)

	ns := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": "hello"}}}
	if _, err := dyn.Resource(nsGVR).Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace hello: %w", err)
	}
	cc, err := manifest("controller.yaml")
	if err != nil {
		return err
	}
	_ = unstructured.SetNestedField(cc.Object, hookURL, "spec", "hooks", "sync", "webhook", "url")
	ccs := dyn.Resource(v1alpha1.CompositeControllerGVR)
	_ = ccs.Delete(ctx, cc.GetName(), metav1.DeleteOptions{})
	if _, err := ccs.Create(ctx, cc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create CompositeController: %w", err)
	}
	say("created CompositeController %s (parent helloworlds.example.com, child pods, Recreate)", cc.GetName())

	hellos := dyn.Resource(helloGVR).Namespace("hello")
	pods := dyn.Resource(podsGVR).Namespace("hello")
	_ = hellos.Delete(ctx, "your-name", metav1.DeleteOptions{})
	waitGone(ctx, pods, "your-name")
	hello, err := manifest("hello.yaml")
	if err != nil {
		return err
	}
	start := time.Now()
	if _, err := hellos.Create(ctx, hello, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create HelloWorld: %w", err)
	}
	say("created HelloWorld hello/your-name with spec.who=%q", "Your Name")
	pod, err := waitPod(ctx, pods, "your-name", "")
	if err != nil {
		return err
	}
	say("child Pod hello/%s appeared after %s, command: %s", pod.GetName(), time.Since(start).Round(time.Millisecond), command(pod))
	parent, err := waitStatus(ctx, hellos, "your-name")
	if err != nil {
		return err
	}
	say("parent status: %v", parent.Object["status"])

	start = time.Now()
	if _, err := hellos.Patch(ctx, "your-name", "application/merge-patch+json", []byte(`{"spec":{"who":"My Name"}}`), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("patch HelloWorld: %w", err)
	}
	say("patched spec.who to %q", "My Name")
	pod2, err := waitPod(ctx, pods, "your-name", string(pod.GetUID()))
	if err != nil {
		return err
	}
	say("Recreate: the Pod was replaced after %s (uid %s -> %s), command: %s", time.Since(start).Round(time.Millisecond),
		short(string(pod.GetUID())), short(string(pod2.GetUID())), command(pod2))
	return nil
}

func short(s string) string {
	if len(s) > 8 {
		return s[:8]
	}
	return s
}

func command(pod *unstructured.Unstructured) string {
	cs, _, _ := unstructured.NestedSlice(pod.Object, "spec", "containers")
	if len(cs) == 0 {
		return ""
	}
	c, _ := cs[0].(map[string]any)
	cmd, _, _ := unstructured.NestedStringSlice(c, "command")
	return strings.Join(cmd, " ")
}

func waitGone(ctx context.Context, r dynamic.ResourceInterface, name string) {
	for i := 0; i < 300; i++ {
		if _, err := r.Get(ctx, name, metav1.GetOptions{}); apierrors.IsNotFound(err) || ctx.Err() != nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitPod waits for the named Pod, different from notUID.
func waitPod(ctx context.Context, r dynamic.ResourceInterface, name, notUID string) (*unstructured.Unstructured, error) {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		p, err := r.Get(ctx, name, metav1.GetOptions{})
		if err == nil && string(p.GetUID()) != notUID && p.GetDeletionTimestamp() == nil {
			return p, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil, errors.New("timed out waiting for the child Pod")
}

func waitStatus(ctx context.Context, r dynamic.ResourceInterface, name string) (*unstructured.Unstructured, error) {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		p, err := r.Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			if n, ok, _ := unstructured.NestedInt64(p.Object, "status", "pods"); ok && n == 1 {
				return p, nil
			}
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil, errors.New("timed out waiting for status.pods=1")
}
