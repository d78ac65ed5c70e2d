package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	composecli "github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/spf13/cobra"

	"github.com/metabus/metabus/examples/helloworld"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/cli"
	"github.com/metabus/metabus/pkg/natsx"
	"github.com/metabus/metabus/sdk/hook"
	"github.com/metabus/metabus/services/dispatcher"
	"github.com/metabus/metabus/services/revisions"
	"github.com/metabus/metabus/services/watcher"
)

// loadCompose loads docker-compose.yaml with the compose-spec loader, as
// `docker compose` does: schema validation, interpolation, YAML anchors and
// merges, and the consistency checks (every named volume and network
// declared, depends_on naming services).
func loadCompose(t *testing.T) *types.Project {
	t.Helper()
	opts, err := composecli.NewProjectOptions([]string{filepath.Join("..", "docker-compose.yaml")},
		composecli.WithWorkingDirectory(".."), composecli.WithName("metabus"), composecli.WithEnv(nil),
		composecli.WithProfiles([]string{"monitoring"}))
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("docker-compose.yaml does not load: %v", err)
	}
	return p
}

// serviceCommand is a metabus binary's command as cmd/<svc>/main.go builds
// it (pkg/cli's Service: the common flags, every upstream flag, the
// service's own), with a Run that starts nothing.
func serviceCommand(svc string) *cobra.Command {
	s := cli.Service{Name: "metabus-" + svc}
	switch svc {
	case "watcher":
		s.Stage, s.Flags = cli.Watcher, (&watcher.Config{}).RegisterFlags
	case "dispatcher":
		s.Stage, s.Flags = cli.Dispatcher, (&dispatcher.Config{}).RegisterFlags
	case "applier":
		s.Stage = cli.Applier
	case "revisions":
		s.Stage, s.Flags = cli.Revisions, (&revisions.Config{}).RegisterFlags
	}
	cmd := s.Command()
	cmd.RunE = func(*cobra.Command, []string) error { return nil }
	return cmd
}

// parseService parses args as svc's binary does (flags, their values and
// the binary's checks of them), running nothing; the command holds the
// values.
func parseService(svc string, args []string) (*cobra.Command, string, int) {
	cmd := serviceCommand(svc)
	var out bytes.Buffer
	code := cli.Run(context.Background(), cmd, args, &out, &out)
	return cmd, out.String(), code
}

// TestDockerCompose checks docker-compose.yaml as far as it can be without
// a Docker engine: it loads and validates; every command uses only flags
// its program accepts (the metabus binaries' commands, pkg/cli's, parsing
// and checking them without starting; nats-server's own parser with its
// real configuration); every bind-mounted file exists;
// the services start in order (NATS healthy, the cluster healthy, the
// example installed); the example's hook is the one the e2e suite runs.
func TestDockerCompose(t *testing.T) {
	p := loadCompose(t)
	binaries := dockerBinaries(t)
	want := append([]string{"nats", "k3s", "setup", "hello-hook", "prometheus", "grafana"}, services...)
	for _, name := range want {
		if _, ok := p.Services[name]; !ok {
			t.Errorf("no service %s", name)
		}
	}
	// bindSource maps a path inside a service's container to the host
	// file a bind mount puts there ("" when none does).
	bindSource := func(svc types.ServiceConfig, path string) string {
		for _, v := range svc.Volumes {
			if v.Type != types.VolumeTypeBind {
				continue
			}
			if rel, err := filepath.Rel(v.Target, path); err == nil && !strings.HasPrefix(rel, "..") {
				return filepath.Join(v.Source, rel)
			}
		}
		return ""
	}
	for name, svc := range p.Services {
		t.Run(name, func(t *testing.T) {
			if svc.Image == "" && svc.Build == nil {
				t.Error("neither image nor build")
			}
			for _, v := range svc.Volumes {
				switch v.Type {
				case types.VolumeTypeBind:
					if _, err := os.Stat(v.Source); err != nil {
						t.Errorf("bind mount %s: %v", v.Target, err)
					}
					if !v.ReadOnly {
						t.Errorf("bind mount %s is writable: the repository is mounted read-only", v.Target)
					}
				case types.VolumeTypeVolume:
					if _, ok := p.Volumes[v.Source]; !ok {
						t.Errorf("volume %s is not declared", v.Source)
					}
				}
			}
			for _, port := range svc.Ports {
				if port.HostIP != "127.0.0.1" {
					t.Errorf("port %s published on %q, want the host's loopback only", port.Published, port.HostIP)
				}
			}
			switch {
			case slices.Contains(services, name):
				checkMetabusService(t, name, svc, binaries)
			case name == "nats":
				checkNATSService(t, svc, bindSource)
			}
		})
	}

	t.Run("k3s node and setup order", func(t *testing.T) {
		k3s, setup := p.Services["k3s"], p.Services["setup"]
		if !regexp.MustCompile(`^rancher/k3s:v\d+\.\d+\.\d+-k3s\d+$`).MatchString(k3s.Image) {
			t.Errorf("k3s image %q: want rancher/k3s at a pinned release", k3s.Image)
		}
		if setup.Image != k3s.Image {
			t.Errorf("setup runs %s, want the cluster's image %s (its kubectl)", setup.Image, k3s.Image)
		}
		if k3s.HealthCheck == nil || len(k3s.HealthCheck.Test) == 0 {
			t.Error("k3s has no healthcheck: setup would start before the API server")
		}
		if !slices.Contains(k3s.Command, "--tls-san=k3s") {
			t.Errorf("k3s command %v: the serving certificate must name k3s, the host the services dial", k3s.Command)
		}
		if cond := setup.DependsOn["k3s"].Condition; cond != types.ServiceConditionHealthy {
			t.Errorf("setup depends on k3s %q, want healthy", cond)
		}
	})

	t.Run("setup script", func(t *testing.T) {
		setup := p.Services["setup"]
		script := strings.Join(setup.Command, "\n")
		// Every file of the repository the script reads is mounted.
		for _, path := range regexp.MustCompile(`/(?:deploy|example)/[A-Za-z0-9_./-]*`).FindAllString(script, -1) {
			src := bindSource(setup, path)
			if src == "" {
				t.Errorf("setup reads %s, which no bind mount provides", path)
				continue
			}
			if _, err := os.Stat(src); err != nil {
				t.Errorf("setup reads %s: %v", path, err)
			}
		}
		hook := p.Services["hello-hook"]
		if !strings.Contains(script, "http://hello-hook:8080/sync") || hook.Name == "" {
			t.Error("setup does not point the controller's hook at the hello-hook service (port 8080, path /sync)")
		}
		if !strings.Contains(script, "/kube/config") || !slices.ContainsFunc(setup.Volumes, func(v types.ServiceVolumeConfig) bool {
			return v.Source == "kube" && v.Target == "/kube" && !v.ReadOnly
		}) {
			t.Error("setup does not write the services' kubeconfig to the volume kube")
		}
		if setup.Restart != "no" {
			t.Errorf("setup restart %q, want no (a one-shot)", setup.Restart)
		}
	})

	t.Run("hook answers as the Go example", func(t *testing.T) {
		checkPythonHook(t)
	})

	t.Run("monitoring", func(t *testing.T) {
		checkMonitoring(t, p, bindSource)
	})

	// Nothing credential-like anywhere in the file.
	raw := readFile(t, filepath.Join("..", "docker-compose.yaml"))
	for _, re := range []string{`://[^/\s:@]+:[^/\s@]+@`, `\bS[UO][A-Z2-7]{50,}`, `(?i)password\s*[:=]\s*[^$\s]`} {
		if m := regexp.MustCompile(re).FindString(raw); m != "" {
			t.Errorf("docker-compose.yaml contains something secret-looking: %q", m)
		}
	}
}

// checkMetabusService checks one metabus service: its binary, that its
// flags parse with the binary's own flag set, and its start order and
// kubeconfig.
func checkMetabusService(t *testing.T, name string, svc types.ServiceConfig, binaries map[string]string) {
	t.Helper()
	cmd := []string(svc.Command)
	if len(cmd) == 0 || cmd[0] != "metabus-"+name {
		t.Fatalf("command %v, want metabus-%s first", cmd, name)
	}
	if _, ok := binaries[cmd[0]]; !ok {
		t.Errorf("%s is not built by the Dockerfile", cmd[0])
	}
	parsed, out, code := parseService(name, cmd[1:])
	if code != cli.ExitOK {
		t.Fatalf("%s does not accept %v (exit %d):\n%s", cmd[0], cmd[1:], code, out)
	}
	fs := parsed.Flags()
	if got := fs.Lookup("kubeconfig").Value.String(); got != "/kube/config" {
		t.Errorf("--kubeconfig %q, want /kube/config", got)
	}
	if got := fs.Lookup("nats-url").Value.String(); got != "nats://nats:4222" {
		t.Errorf("--nats-url %q, want nats://nats:4222", got)
	}
	if !slices.ContainsFunc(svc.Volumes, func(v types.ServiceVolumeConfig) bool {
		return v.Source == "kube" && v.Target == "/kube" && v.ReadOnly
	}) {
		t.Error("the kubeconfig volume is not mounted read-only at /kube")
	}
	for dep, cond := range map[string]string{"nats": types.ServiceConditionHealthy, "setup": types.ServiceConditionCompletedSuccessfully} {
		if got := svc.DependsOn[dep].Condition; got != cond {
			t.Errorf("depends on %s %q, want %q", dep, got, cond)
		}
	}
	if !svc.ReadOnly || !slices.Contains(svc.CapDrop, "ALL") {
		t.Error("not read-only with every capability dropped, as the Deployments")
	}
}

// checkNATSService parses the nats service's command with nats-server's own
// option parser, the configuration file read from where the bind mount
// takes it.
func checkNATSService(t *testing.T, svc types.ServiceConfig, bindSource func(types.ServiceConfig, string) string) {
	t.Helper()
	if svc.Image != natsx.ServerImage {
		t.Errorf("image %q, want %q (the nats-server go.mod builds)", svc.Image, natsx.ServerImage)
	}
	cmd := []string(svc.Command)
	if len(cmd) == 0 || cmd[0] != "nats-server" {
		t.Fatalf("command %v, want nats-server first", cmd)
	}
	args := slices.Clone(cmd[1:])
	conf := ""
	for i, a := range args {
		if (a == "--config" || a == "-c") && i+1 < len(args) {
			conf = bindSource(svc, args[i+1])
			if conf == "" {
				t.Fatalf("config %s is not mounted", args[i+1])
			}
			args[i+1] = conf
		}
	}
	fs := flag.NewFlagSet("nats-server", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	noop := func() {}
	opts, err := server.ConfigureOptions(fs, args, noop, noop, noop)
	if err != nil {
		t.Fatalf("nats-server refuses %v: %v", cmd[1:], err)
	}
	if !opts.JetStream || opts.StoreDir != "/data" {
		t.Errorf("JetStream %v in %q, want enabled in /data (the volume)", opts.JetStream, opts.StoreDir)
	}
	if opts.MaxPayload != bus.MaxPayload {
		t.Errorf("max_payload %d, want the bus's %d (bus.MaxPayload)", opts.MaxPayload, bus.MaxPayload)
	}
	if svc.HealthCheck == nil || len(svc.HealthCheck.Test) == 0 {
		t.Error("no healthcheck: the services would start before JetStream")
	}
}

// checkPythonHook runs the compose stack's hook (sync.py) on a request
// and compares its answer with the Go example's, which the e2e suite runs.
func checkPythonHook(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not on PATH")
	}
	req := map[string]any{
		"parent":   map[string]any{"metadata": map[string]any{"name": "your-name"}, "spec": map[string]any{"who": "Your Name"}},
		"children": map[string]any{"Pod.v1": map[string]any{"your-name": map[string]any{}}},
	}
	data, _ := json.Marshal(req)
	cmd := exec.Command(py, "-c", "import json, sys; sys.path.insert(0, sys.argv[1]); import sync; print(json.dumps(sync.sync(json.load(sys.stdin))))",
		filepath.Join("..", "examples", "helloworld", "hook"))
	cmd.Stdin = strings.NewReader(string(data))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("sync.py: %v", err)
	}
	var goReq hook.CompositeRequest
	if err := json.Unmarshal(data, &goReq); err != nil {
		t.Fatal(err)
	}
	goResp, err := helloworld.Sync(context.Background(), &goReq)
	if err != nil {
		t.Fatal(err)
	}
	var got, want any
	wantJSON, _ := json.Marshal(goResp)
	_ = json.Unmarshal(wantJSON, &want)
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("sync.py answers\n%s\nthe Go hook\n%s", out, wantJSON)
	}
}

// checkMonitoring checks the "monitoring" profile: Prometheus scrapes every
// metabus service on its metrics port and loads metabus's rules; Grafana
// gets the Prometheus service as data source and metabus's dashboard.
func checkMonitoring(t *testing.T, p *types.Project, bindSource func(types.ServiceConfig, string) string) {
	prom, graf := p.Services["prometheus"], p.Services["grafana"]
	for _, svc := range []types.ServiceConfig{prom, graf} {
		if !slices.Equal(svc.Profiles, []string{"monitoring"}) {
			t.Errorf("%s is in profiles %v, want only monitoring", svc.Name, svc.Profiles)
		}
	}
	cfgPath := bindSource(prom, "/etc/prometheus/prometheus.yml")
	if cfgPath == "" {
		t.Fatal("prometheus.yml is not mounted")
	}
	var cfg struct {
		RuleFiles     []string `json:"rule_files"`
		ScrapeConfigs []struct {
			StaticConfigs []struct {
				Targets []string `json:"targets"`
			} `json:"static_configs"`
		} `json:"scrape_configs"`
	}
	docs, err := parseDocs([]byte(readFile(t, cfgPath)))
	if err != nil || len(docs) != 1 {
		t.Fatalf("prometheus.yml: %v", err)
	}
	data, _ := json.Marshal(docs[0])
	if err := json.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	for _, rf := range cfg.RuleFiles {
		if src := bindSource(prom, rf); src == "" || filepath.Base(src) != "metabus-rules.yaml" {
			t.Errorf("rule file %s is not metabus's rules (mounted from %q)", rf, src)
		}
	}
	scraped := map[string]bool{}
	for _, sc := range cfg.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			for _, target := range st.Targets {
				host, port, _ := strings.Cut(target, ":")
				svc, ok := p.Services[host]
				if !ok {
					t.Errorf("target %s names no service", target)
					continue
				}
				parsed, _, _ := parseService(host, svc.Command[1:])
				if _, metricsPort, _ := strings.Cut(parsed.Flags().Lookup("metrics-address").Value.String(), ":"); metricsPort != port {
					t.Errorf("target %s: %s serves metrics on port %s", target, host, metricsPort)
				}
				scraped[host] = true
			}
		}
	}
	for _, svc := range services {
		if !scraped[svc] {
			t.Errorf("Prometheus does not scrape %s", svc)
		}
	}
	ds := readFile(t, bindSource(graf, "/etc/grafana/provisioning/datasources/metabus.yaml"))
	if !strings.Contains(ds, "url: http://prometheus:9090") {
		t.Error("Grafana's data source is not the prometheus service")
	}
	prov := readFile(t, bindSource(graf, "/etc/grafana/provisioning/dashboards/metabus.yaml"))
	m := regexp.MustCompile(`(?m)^\s*path:\s*(\S+)`).FindStringSubmatch(prov)
	if m == nil {
		t.Fatal("the dashboard provider has no path")
	}
	if src := bindSource(graf, filepath.Join(m[1], "metabus-dashboard.json")); src == "" || filepath.Base(src) != "metabus-dashboard.json" {
		t.Errorf("the dashboard provider's %s does not hold metabus-dashboard.json", m[1])
	}
}
