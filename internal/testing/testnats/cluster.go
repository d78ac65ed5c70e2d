package testnats

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/pkg/natscreds"
)

// AdminUser is the test bed's own nkey user (not in the shipped
// configuration): no permission list, so it may use the whole JetStream
// API (leader stepdowns, reading any stream). Tests and the fault suite
// inspect and steer the cluster with it; services never use it.
const AdminUser = "admin"

// ClusterOptions configure a Cluster.
type ClusterOptions struct {
	// Conf is the path of deploy/nats/nats-server.conf; cluster.conf is
	// read next to it.
	Conf string
	// Dir holds the nodes' configurations, stores and logs.
	Dir string
	// Bin is a nats-server binary (BuildServer makes one).
	Bin string
	// Nodes is the cluster size; 0 means the shipped cluster.conf's (3).
	// 1 runs one server without a cluster block (for R1 comparisons).
	Nodes int
	// SyncInterval, when set, replaces the shipped JetStream sync_interval
	// ("always", "2m", ...): for measurements, never for the fault suite.
	SyncInterval string
	// Profile gives every node a pprof port (prof_port; Node.ProfPort).
	Profile bool
	// Logf receives the test bed's own messages (nil: none).
	Logf func(format string, args ...any)
}

// Cluster is a NATS cluster of real nats-server processes on loopback,
// configured from the shipped deploy/nats/nats-server.conf and
// cluster.conf: JetStream on a file store per node, the services' nkey
// users and permissions, routes between every pair of nodes. Each route
// runs through its own Proxy (one per ordered pair of nodes), so a node can
// be partitioned from the others; services reach the nodes through
// per-service proxies (ServiceURL), so one can be cut from NATS alone.
//
// Differences from the shipped configuration, all forced by running three
// nodes on one host: loopback addresses and per-node ports; routes that
// name the proxies, and a cluster advertise address nobody listens on, so
// the nodes' gossip cannot open direct routes around the proxies;
// no_advertise, so clients only know the URLs they were given (their
// proxies); and the admin user.
type Cluster struct {
	opts  ClusterOptions
	Nodes []*Node
	// Seeds are the seed files (--nats-nkey) of each service's user and of
	// AdminUser.
	Seeds map[string]string

	// routes[i][j] carries the routes node i opens to node j.
	routes [][]*Proxy

	mu       sync.Mutex
	services map[string]*ProxySet
	closed   bool
}

// Node is one nats-server process of a Cluster.
type Node struct {
	Name        string // server_name (POD_NAME): nats-<index>
	Index       int
	ClientPort  int
	ClusterPort int
	HTTPPort    int
	ProfPort    int    // pprof (/debug/pprof), with ClusterOptions.Profile
	Dir         string // configuration, store and log of this node
	Store       string // JetStream store directory
	LogPath     string
	proc        *process
}

// ClientURL is the node's own client URL (no proxy).
func (n *Node) ClientURL() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.ClientPort) }

// Running reports whether the node's process is running.
func (n *Node) Running() bool { return n.proc.running() }

// StartCluster starts a Cluster for a test (nats-server built once per test
// binary) and stops it when the test ends.
func StartCluster(t testing.TB, conf string) *Cluster {
	t.Helper()
	bin, err := testServerBinary()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := NewCluster(ctx, ClusterOptions{Conf: conf, Dir: t.TempDir(), Bin: bin, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		for _, e := range c.UnexpectedExits() {
			t.Errorf("nats-server exited on its own: %s", e)
		}
	})
	return c
}

var (
	testBinOnce sync.Once
	testBin     string
	testBinErr  error
)

// testServerBinary builds nats-server once per test process.
func testServerBinary() (string, error) {
	testBinOnce.Do(func() {
		dir, err := os.MkdirTemp("", "testnats-bin-")
		if err != nil {
			testBinErr = err
			return
		}
		// Left behind on purpose: the binary may serve every test of the
		// process, and a temp directory is the system's to clean.
		testBin, testBinErr = BuildServer(context.Background(), dir)
	})
	return testBin, testBinErr
}

// NewCluster writes each node's configuration, starts every node and waits
// until JetStream has a meta leader that every node follows. A node that
// finds one of its ports taken (FreePort frees a port before the node binds
// it, and the cluster's own proxies or a test running in parallel may take
// it meanwhile: seen in CI as "bind: address already in use") makes the
// whole cluster start again, from empty node directories and with new
// ports, up to startAttempts times.
func NewCluster(ctx context.Context, o ClusterOptions) (*Cluster, error) {
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	for attempt := 1; ; attempt++ {
		c, err := newCluster(ctx, o)
		if err == nil || attempt == startAttempts || !strings.Contains(err.Error(), "address already in use") {
			return c, err
		}
		o.Logf("testnats: a port was taken before its node bound it, starting the cluster again: %v", err)
		dirs, gerr := filepath.Glob(filepath.Join(o.Dir, "nats-*"))
		if gerr != nil {
			return nil, gerr
		}
		for _, d := range dirs {
			if rerr := os.RemoveAll(d); rerr != nil {
				return nil, fmt.Errorf("%w (and clearing %s to start again: %v)", err, d, rerr)
			}
		}
	}
}

// startAttempts bounds NewCluster's starts over ports taken meanwhile.
const startAttempts = 3

func newCluster(ctx context.Context, o ClusterOptions) (*Cluster, error) {
	mainConf, err := os.ReadFile(o.Conf)
	if err != nil {
		return nil, err
	}
	clusterConf, err := os.ReadFile(filepath.Join(filepath.Dir(o.Conf), "cluster.conf"))
	if err != nil {
		return nil, err
	}
	shippedRoutes, err := routeCount(string(clusterConf))
	if err != nil {
		return nil, err
	}
	if o.Nodes == 0 {
		o.Nodes = shippedRoutes
	}
	c := &Cluster{opts: o, Seeds: map[string]string{}, services: map[string]*ProxySet{}}
	ok := false
	defer func() {
		if !ok {
			c.Close()
		}
	}()
	env := []string{}
	for _, user := range append(append([]string{}, natscreds.Users...), AdminUser) {
		pub, seed, err := newUserFile(o.Dir, user)
		if err != nil {
			return nil, err
		}
		c.Seeds[user] = seed
		env = append(env, natscreds.UserKey(user)+"="+pub)
	}
	for i := range o.Nodes {
		n := &Node{Name: fmt.Sprintf("nats-%d", i), Index: i, Dir: filepath.Join(o.Dir, fmt.Sprintf("nats-%d", i))}
		n.Store = filepath.Join(n.Dir, "jetstream")
		n.LogPath = filepath.Join(n.Dir, "nats-server.log")
		if err := os.MkdirAll(n.Dir, 0o755); err != nil {
			return nil, err
		}
		ports := []*int{&n.ClientPort, &n.ClusterPort, &n.HTTPPort}
		if o.Profile {
			ports = append(ports, &n.ProfPort)
		}
		for _, port := range ports {
			if *port, err = freePort(); err != nil {
				return nil, err
			}
		}
		c.Nodes = append(c.Nodes, n)
	}
	c.routes = make([][]*Proxy, o.Nodes)
	for i, from := range c.Nodes {
		c.routes[i] = make([]*Proxy, o.Nodes)
		for j, to := range c.Nodes {
			if i == j {
				continue
			}
			p, err := NewProxy(fmt.Sprintf("route %s->%s", from.Name, to.Name), "127.0.0.1:0", fmt.Sprintf("127.0.0.1:%d", to.ClusterPort))
			if err != nil {
				return nil, err
			}
			c.routes[i][j] = p
		}
	}
	for i, n := range c.Nodes {
		var routes []string
		for j := range c.Nodes {
			if j != i {
				routes = append(routes, "nats-route://"+c.routes[i][j].Addr())
			}
		}
		conf, cconf, err := renderNode(string(mainConf), string(clusterConf), n, routes, o.SyncInterval)
		if err != nil {
			return nil, err
		}
		if o.Nodes == 1 {
			// One server, as StartProduction runs it: no cluster block.
			cconf = "# one node: no cluster block\n"
		}
		if n.ProfPort != 0 {
			conf += fmt.Sprintf("\n# Profiling (test bed only).\nprof_port: %d\n", n.ProfPort)
		}
		if err := os.WriteFile(filepath.Join(n.Dir, "cluster.conf"), []byte(cconf), 0o644); err != nil {
			return nil, err
		}
		path := filepath.Join(n.Dir, "nats-server.conf")
		if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
			return nil, err
		}
		n.proc = &process{name: n.Name, bin: o.Bin, args: []string{"-c", path},
			env: append([]string{"POD_NAME=" + n.Name}, env...), logPath: n.LogPath}
	}
	for _, n := range c.Nodes {
		if err := n.proc.start(); err != nil {
			return nil, err
		}
	}
	if err := c.waitFor(ctx, func(ctx context.Context) error {
		if exits := c.UnexpectedExits(); len(exits) > 0 {
			return fmt.Errorf("%w: %s", errGaveUp, strings.Join(exits, "; "))
		}
		return c.Healthy(ctx)
	}); err != nil {
		if exits := c.UnexpectedExits(); len(exits) > 0 {
			return nil, fmt.Errorf("%w; %s", err, strings.Join(exits, "; "))
		}
		return nil, err
	}
	ok = true
	return c, nil
}

// routeCount checks that cluster.conf has the shape the test bed rewrites
// (a cluster block with listen and routes) and returns its route count,
// the cluster size it was written for.
func routeCount(clusterConf string) (int, error) {
	if !regexp.MustCompile(`(?m)^cluster\s*\{`).MatchString(clusterConf) {
		return 0, errors.New("cluster.conf has no cluster block (update testnats's rewrites)")
	}
	m := regexp.MustCompile(`(?s)\n\s*routes:\s*\[(.*?)\]`).FindStringSubmatch(clusterConf)
	if m == nil {
		return 0, errors.New("cluster.conf has no routes list (update testnats's rewrites)")
	}
	n := len(regexp.MustCompile(`nats-route://`).FindAllString(m[1], -1))
	if n < 1 {
		return 0, errors.New("cluster.conf lists no route")
	}
	return n, nil
}

// renderNode returns a node's nats-server.conf and cluster.conf: the
// shipped files with the node's addresses and directories, routes through
// the proxies, the admin user added, and everything else as shipped.
func renderNode(mainConf, clusterConf string, n *Node, routes []string, syncInterval string) (string, string, error) {
	text, err := rewrite("nats-server.conf", mainConf, []rewriteRule{
		{`(?m)^listen:.*$`, fmt.Sprintf("listen: 127.0.0.1:%d", n.ClientPort)},
		{`(?m)^http_port:.*$`, fmt.Sprintf("http_port: %d", n.HTTPPort)},
		{`(?m)^pid_file:.*$`, fmt.Sprintf("pid_file: %q", filepath.Join(n.Dir, "nats.pid"))},
		{`(?m)^([ \t]*)store_dir:.*$`, fmt.Sprintf("${1}store_dir: %q", n.Store)},
		// Included relative to the file: the node's own cluster.conf.
		{`(?m)^include[ \t]+\./cluster\.conf[ \t]*$`, "${0}"},
		// The admin user: no permissions block, everything allowed.
		{`(?m)^([ \t]*)users[ \t]*=[ \t]*\[[ \t]*$`, "${0}\n${1}  { nkey: $$ADMIN_NKEY }"},
	})
	if err != nil {
		return "", "", err
	}
	if syncInterval != "" {
		re := regexp.MustCompile(`(?m)^([ \t]*)sync_interval:.*$`)
		if re.MatchString(text) {
			text = re.ReplaceAllString(text, fmt.Sprintf("${1}sync_interval: %s", syncInterval))
		} else if text, err = rewrite("nats-server.conf", text, []rewriteRule{
			{`(?m)^jetstream[ \t]*\{[ \t]*$`, fmt.Sprintf("${0}\n  sync_interval: %s", syncInterval)},
		}); err != nil {
			return "", "", err
		}
	}
	var rs strings.Builder
	for _, r := range routes {
		fmt.Fprintf(&rs, "    %s\n", r)
	}
	cconf, err := rewrite("cluster.conf", clusterConf, []rewriteRule{
		{`(?m)^([ \t]+)listen:.*$`, fmt.Sprintf("${1}listen: 127.0.0.1:%d\n"+
			"${1}# Gossip must not open routes around the proxies, nor tell\n"+
			"${1}# clients the nodes' own URLs (test bed only).\n"+
			"${1}advertise: \"127.0.0.1:1\"\n${1}no_advertise: true", n.ClusterPort)},
		{`(?s)routes:\s*\[.*?\]`, "routes: [\n" + rs.String() + "  ]"},
		// Plaintext, as deploy/overlays/plaintext runs it: the test bed has
		// no certificates, and its routes go through proxies on loopback.
		// deploy's tests check TLS (natstls_test.go).
		{`(?m)^include[ \t]+\./tls\.conf[ \t]*$`, "# TLS of clients: off in the test bed"},
		{`(?m)^([ \t]*)include[ \t]+\./route-tls\.conf[ \t]*$`, "${1}# TLS of routes: off in the test bed"},
	})
	if err != nil {
		return "", "", err
	}
	return text, cconf, nil
}

type rewriteRule struct{ re, repl string }

// rewrite applies rules that must each match exactly once.
func rewrite(file, text string, rules []rewriteRule) (string, error) {
	for _, r := range rules {
		re := regexp.MustCompile(r.re)
		if n := len(re.FindAllStringIndex(text, -1)); n != 1 {
			return "", fmt.Errorf("%s: %d places match %s, want 1 (update testnats's rewrites)", file, n, r.re)
		}
		text = re.ReplaceAllString(text, r.repl)
	}
	return text, nil
}

// newUserFile creates an nkey user and writes its seed to dir/name.nk.
func newUserFile(dir, name string) (pub, seedFile string, err error) {
	pub, seed, err := newUser()
	if err != nil {
		return "", "", err
	}
	seedFile = filepath.Join(dir, name+".nk")
	return pub, seedFile, os.WriteFile(seedFile, seed, 0o600)
}

// URLs are the nodes' own client URLs, comma separated (no proxy).
func (c *Cluster) URLs() string {
	var urls []string
	for _, n := range c.Nodes {
		urls = append(urls, n.ClientURL())
	}
	return strings.Join(urls, ",")
}

// ServiceURL returns the client URLs (comma separated, one per node) a
// service named name connects through: proxies of its own, which
// CutService cuts. The first call for a name creates them.
func (c *Cluster) ServiceURL(name string) (string, error) {
	ps, err := c.serviceProxies(name)
	if err != nil {
		return "", err
	}
	var urls []string
	for _, p := range ps.Proxies {
		urls = append(urls, "nats://"+p.Addr())
	}
	return strings.Join(urls, ","), nil
}

func (c *Cluster) serviceProxies(name string) (*ProxySet, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ps := c.services[name]; ps != nil {
		return ps, nil
	}
	if c.closed {
		return nil, errors.New("cluster closed")
	}
	ps := &ProxySet{}
	for _, n := range c.Nodes {
		p, err := NewProxy(name+"->"+n.Name, "127.0.0.1:0", fmt.Sprintf("127.0.0.1:%d", n.ClientPort))
		if err != nil {
			ps.Close()
			return nil, err
		}
		ps.Proxies = append(ps.Proxies, p)
	}
	c.services[name] = ps
	return ps, nil
}

// Service returns the proxies of a service's client connections (created
// on first use): Cut cuts it from every node.
func (c *Cluster) Service(name string) (*ProxySet, error) { return c.serviceProxies(name) }

// RouteProxies returns the proxies of every route between node i and the
// others: cutting them partitions node i from the rest of the cluster,
// while its clients still reach it.
func (c *Cluster) RouteProxies(i int) *ProxySet {
	ps := &ProxySet{}
	for j := range c.Nodes {
		if j != i {
			ps.Proxies = append(ps.Proxies, c.routes[i][j], c.routes[j][i])
		}
	}
	return ps
}

// Partition cuts node i from the other nodes (see RouteProxies); Heal
// undoes it.
func (c *Cluster) Partition(i int) { c.RouteProxies(i).Cut() }

// Heal ends a partition of node i.
func (c *Cluster) Heal(i int) { c.RouteProxies(i).Heal() }

// Kill SIGKILLs node i and waits until it is gone.
func (c *Cluster) Kill(i int) error { return c.Nodes[i].proc.kill() }

// Stop stops node i the way Kubernetes does: lame-duck mode (the
// StatefulSet's preStop hook), then a wait for the exit, then SIGKILL
// after grace.
func (c *Cluster) Stop(i int, grace time.Duration) error {
	return c.Nodes[i].proc.stop(grace)
}

// Start starts node i again (same ports, same store unless wiped).
func (c *Cluster) Start(i int) error { return c.Nodes[i].proc.start() }

// Wipe deletes node i's JetStream store: a node whose disk was lost. The
// node must be stopped.
func (c *Cluster) Wipe(i int) error {
	n := c.Nodes[i]
	if n.proc.running() {
		return fmt.Errorf("wipe %s: still running", n.Name)
	}
	return os.RemoveAll(n.Store)
}

// UnexpectedExits describes every node exit that Kill, Stop or Close did
// not cause.
func (c *Cluster) UnexpectedExits() []string {
	var out []string
	for _, n := range c.Nodes {
		out = append(out, n.proc.unexpectedExits()...)
	}
	return out
}

// Usage is the CPU time all nodes used so far (processes that exited
// included) and, per node, the current and peak resident memory of its
// running process.
func (c *Cluster) Usage() (cpu time.Duration, rss, peak []int64) {
	for _, n := range c.Nodes {
		used, r, p := n.proc.usage()
		cpu += used
		rss, peak = append(rss, r), append(peak, p)
	}
	return cpu, rss, peak
}

// Close stops every node and proxy.
func (c *Cluster) Close() {
	c.mu.Lock()
	c.closed = true
	services := c.services
	c.mu.Unlock()
	for _, n := range c.Nodes {
		if n.proc != nil {
			_ = n.proc.stopNow()
		}
	}
	for _, row := range c.routes {
		for _, p := range row {
			if p != nil {
				p.Close()
			}
		}
	}
	for _, ps := range services {
		ps.Close()
	}
}

// Connect connects as user (a service or AdminUser) directly to the nodes
// (no proxy), reconnecting for ever.
func (c *Cluster) Connect(user string, extra ...nats.Option) (*nats.Conn, error) {
	opt, err := nats.NkeyOptionFromSeed(c.Seeds[user])
	if err != nil {
		return nil, err
	}
	opts := append([]nats.Option{opt, nats.Name("testnats-" + user), nats.MaxReconnects(-1),
		nats.ReconnectWait(200 * time.Millisecond), nats.Timeout(3 * time.Second)}, extra...)
	return nats.Connect(c.URLs(), opts...)
}

// jsz is the part of a node's /jsz the test bed reads.
type jsz struct {
	Meta *struct {
		Leader string `json:"leader"`
	} `json:"meta_cluster"`
}

// MetaLeader returns the name of the JetStream meta leader as the running
// nodes see it (the monitoring endpoint /jsz: the account-level JetStream
// API does not show it). It fails while no leader is known or the nodes
// disagree.
func (c *Cluster) MetaLeader(ctx context.Context) (string, error) {
	leader := ""
	for _, n := range c.Nodes {
		if !n.Running() {
			continue
		}
		var j jsz
		if err := c.getJSON(ctx, n, "/jsz", &j); err != nil {
			return "", err
		}
		if j.Meta == nil || j.Meta.Leader == "" {
			return "", fmt.Errorf("%s knows no meta leader", n.Name)
		}
		if leader != "" && leader != j.Meta.Leader {
			return "", fmt.Errorf("nodes disagree on the meta leader: %s and %s", leader, j.Meta.Leader)
		}
		leader = j.Meta.Leader
	}
	if leader == "" {
		return "", errors.New("no node running")
	}
	return leader, nil
}

// NodeIndex returns the index of the node called name, or -1.
func (c *Cluster) NodeIndex(name string) int {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n.Index
		}
	}
	return -1
}

// StreamLeader returns the server name of a stream's leader (stream info
// through the JetStream API).
func (c *Cluster) StreamLeader(ctx context.Context, js jetstream.JetStream, stream string) (string, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return "", fmt.Errorf("stream %s: %w", stream, err)
	}
	info := s.CachedInfo()
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return "", fmt.Errorf("stream %s has no leader", stream)
	}
	return info.Cluster.Leader, nil
}

// ConsumerLeader returns the server name of a consumer's leader.
func (c *Cluster) ConsumerLeader(ctx context.Context, js jetstream.JetStream, stream, consumer string) (string, error) {
	cons, err := js.Consumer(ctx, stream, consumer)
	if err != nil {
		return "", fmt.Errorf("consumer %s/%s: %w", stream, consumer, err)
	}
	info := cons.CachedInfo()
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return "", fmt.Errorf("consumer %s/%s has no leader", stream, consumer)
	}
	return info.Cluster.Leader, nil
}

// StepDownStream asks a stream's leader to step down
// ($JS.API.STREAM.LEADER.STEPDOWN.<stream>); another replica takes over.
func StepDownStream(ctx context.Context, nc *nats.Conn, stream string) error {
	return stepDown(ctx, nc, fmt.Sprintf("$JS.API.STREAM.LEADER.STEPDOWN.%s", stream))
}

// StepDownConsumer asks a consumer's leader to step down
// ($JS.API.CONSUMER.LEADER.STEPDOWN.<stream>.<consumer>).
func StepDownConsumer(ctx context.Context, nc *nats.Conn, stream, consumer string) error {
	return stepDown(ctx, nc, fmt.Sprintf("$JS.API.CONSUMER.LEADER.STEPDOWN.%s.%s", stream, consumer))
}

func stepDown(ctx context.Context, nc *nats.Conn, subject string) error {
	msg, err := nc.RequestWithContext(ctx, subject, nil)
	if err != nil {
		return fmt.Errorf("%s: %w", subject, err)
	}
	var resp struct {
		Success bool `json:"success"`
		Error   *struct {
			Code        int    `json:"code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return fmt.Errorf("%s: %w", subject, err)
	}
	if resp.Error != nil {
		return fmt.Errorf("%s: %s (%d)", subject, resp.Error.Description, resp.Error.Code)
	}
	if !resp.Success {
		return fmt.Errorf("%s: not successful", subject)
	}
	return nil
}

// Healthy checks every node's /healthz (the full check: JetStream enabled,
// the meta group current, and every stream and consumer this node holds
// current with its leader). A stopped node is unhealthy.
func (c *Cluster) Healthy(ctx context.Context) error {
	for _, n := range c.Nodes {
		if err := c.NodeHealthy(ctx, n.Index, ""); err != nil {
			return err
		}
	}
	if len(c.Nodes) == 1 {
		return nil // one server: no meta group
	}
	if _, err := c.MetaLeader(ctx); err != nil {
		return err
	}
	return nil
}

// NodeHealthy checks node i's /healthz with query (e.g.
// "js-server-only=true", the StatefulSet's readiness probe; "" is the
// full check).
func (c *Cluster) NodeHealthy(ctx context.Context, i int, query string) error {
	n := c.Nodes[i]
	if !n.Running() {
		return fmt.Errorf("%s is not running", n.Name)
	}
	path := "/healthz"
	if query != "" {
		path += "?" + query
	}
	var h struct {
		Status string `json:"status"`
		Error  string `json:"error"`
	}
	if err := c.getJSON(ctx, n, path, &h); err != nil {
		return err
	}
	if h.Status != "ok" {
		return fmt.Errorf("%s %s: %s %s", n.Name, path, h.Status, h.Error)
	}
	return nil
}

// WaitHealthy waits until Healthy passes.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	return c.waitFor(ctx, c.Healthy)
}

// WaitNode waits until node i passes /healthz?query.
func (c *Cluster) WaitNode(ctx context.Context, i int, query string) error {
	return c.waitFor(ctx, func(ctx context.Context) error { return c.NodeHealthy(ctx, i, query) })
}

// errGaveUp ends a wait at once.
var errGaveUp = errors.New("gave up")

func (c *Cluster) waitFor(ctx context.Context, check func(context.Context) error) error {
	var last error
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		last = check(cctx)
		cancel()
		if last == nil || errors.Is(last, errGaveUp) {
			return last
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), last)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// getJSON reads a monitoring endpoint of node n. /healthz answers 503
// with a JSON body when unhealthy: that body is decoded too.
func (c *Cluster) getJSON(ctx context.Context, n *Node, path string, into any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d%s", n.HTTPPort, path), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", n.Name, path, err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(into); err != nil {
		return fmt.Errorf("%s %s (HTTP %d): %w", n.Name, path, resp.StatusCode, err)
	}
	return nil
}

// freePort is FreePort, for NewCluster; a test replaces it to hand a node a
// port that is taken.
var freePort = FreePort

// ProxySet is a group of proxies cut and healed together.
type ProxySet struct {
	Proxies []*Proxy
}

// Cut cuts every proxy of the set.
func (s *ProxySet) Cut() {
	for _, p := range s.Proxies {
		p.Cut()
	}
}

// Heal heals every proxy of the set.
func (s *ProxySet) Heal() {
	for _, p := range s.Proxies {
		p.Heal()
	}
}

// CutOn arms every proxy of the set to cut on pattern (see Proxy.CutOn);
// when one fires, the others are cut too. fired is closed once that
// happened; disarm takes back the proxies that did not fire.
func (s *ProxySet) CutOn(pattern []byte) (fired <-chan struct{}, disarm func()) {
	done := make(chan struct{})
	quit := make(chan struct{})
	var once sync.Once
	for _, p := range s.Proxies {
		ch := p.CutOn(pattern)
		go func() {
			select {
			case <-ch:
				s.Cut()
				once.Do(func() { close(done) })
			case <-quit:
			}
		}()
	}
	var stop sync.Once
	return done, func() {
		stop.Do(func() {
			close(quit)
			for _, p := range s.Proxies {
				p.Disarm()
			}
		})
	}
}

// Close closes every proxy of the set.
func (s *ProxySet) Close() {
	for _, p := range s.Proxies {
		p.Close()
	}
}
