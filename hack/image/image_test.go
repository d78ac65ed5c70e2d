package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"log"
	"maps"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"sigs.k8s.io/yaml"
)

const repoRoot = "../.."

func TestParseVersion(t *testing.T) {
	for _, tc := range []struct {
		in, want, reason string
		err              bool
	}{
		{in: "0.1.0\n", want: "0.1.0", reason: "the file as written: one line"},
		{in: "0.1.0", want: "0.1.0", reason: "no newline at the end"},
		{in: "1.2.3-rc.1\n", want: "1.2.3-rc.1", reason: "a pre-release is a valid tag"},
		{in: "v0.1.0\n", err: true, reason: "the manifests pin 0.1.0; a v prefix would differ from the chart's appVersion"},
		{in: "0.1.0+build.1\n", err: true, reason: "'+' is not allowed in an image tag"},
		{in: "0.1\n", err: true, reason: "not MAJOR.MINOR.PATCH"},
		{in: " 0.1.0\n", err: true, reason: "stray whitespace"},
		{in: "0.1.0\n0.2.0\n", err: true, reason: "two versions"},
		{in: "", err: true, reason: "empty"},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			got, err := parseVersion(tc.in)
			if (err != nil) != tc.err {
				t.Fatalf("parseVersion(%q) error %v, want error %v", tc.in, err, tc.err)
			}
			if got != tc.want {
				t.Errorf("parseVersion(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestParseEpoch(t *testing.T) {
	for _, tc := range []struct {
		in, reason string
		want       time.Time
		err        bool
	}{
		{in: "1700000000", want: time.Unix(1700000000, 0).UTC(), reason: "seconds since 1970"},
		{in: "1700000000\n", want: time.Unix(1700000000, 0).UTC(), reason: "git log's output ends in a newline"},
		{in: "0", want: time.Unix(0, 0).UTC(), reason: "the epoch itself"},
		{in: "-1", err: true, reason: "before 1970"},
		{in: "2023-11-14", err: true, reason: "a date, not seconds"},
		{in: "", err: true, reason: "empty"},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			got, err := parseEpoch(tc.in)
			if (err != nil) != tc.err {
				t.Fatalf("parseEpoch(%q) error %v, want error %v", tc.in, err, tc.err)
			}
			if !got.Equal(tc.want) || got.Location() != tc.want.Location() {
				t.Errorf("parseEpoch(%q) = %v, want %v", tc.in, got, tc.want)
			}
		})
	}
}

// TestGoEnv: the caller's variables that change the generated code are
// replaced, the rest (GOCACHE, PATH, proxies) kept.
func TestGoEnv(t *testing.T) {
	got := goEnv([]string{"PATH=/bin", "GOAMD64=v3", "CGO_ENABLED=1", "GOFLAGS=-race", "GOEXPERIMENT=x", "GOCACHE=/c", "GOARCH=386"}, "arm64")
	want := []string{"PATH=/bin", "GOCACHE=/c", "CGO_ENABLED=0", "GOOS=linux", "GOARCH=arm64", "GOFLAGS=-buildvcs=false", "GOAMD64=v1", "GOARM64=v8.0"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("goEnv (-want +got):\n%s", diff)
	}
}

// entry is a layer's tar header and content, as the test reads it back.
type entry struct {
	hdr  *tar.Header
	data []byte
}

func readTar(t *testing.T, r io.Reader) map[string]entry {
	t.Helper()
	out := map[string]entry{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out["/"+strings.TrimSuffix(h.Name, "/")] = entry{h, data}
	}
}

// TestLayer: a layer's bytes depend on its files and time only (same
// inputs in another order, same bytes), and every entry carries that time
// and no owner names.
func TestLayer(t *testing.T) {
	created := time.Unix(1700000000, 0).UTC()
	base, err := baseFiles()
	if err != nil {
		t.Fatal(err)
	}
	var a, b, c bytes.Buffer
	if err := writeLayer(&a, base, created); err != nil {
		t.Fatal(err)
	}
	reversed := slices.Clone(base)
	slices.Reverse(reversed)
	if err := writeLayer(&b, reversed, created); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Error("the same files in another order give another layer")
	}
	if err := writeLayer(&c, base, created.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(a.Bytes(), c.Bytes()) {
		t.Error("the time is not in the layer")
	}
	zr, err := gzip.NewReader(bytes.NewReader(a.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if !zr.ModTime.IsZero() || zr.Name != "" {
		t.Errorf("gzip header has time %v, name %q", zr.ModTime, zr.Name)
	}
	files := readTar(t, zr)
	var names []string
	for p, e := range files {
		names = append(names, p)
		if !e.hdr.ModTime.Equal(created) || e.hdr.Uname != "" || e.hdr.Gname != "" || len(e.hdr.PAXRecords) > 0 {
			t.Errorf("%s: mtime %v, owner %q:%q, PAX %v", p, e.hdr.ModTime, e.hdr.Uname, e.hdr.Gname, e.hdr.PAXRecords)
		}
	}
	slices.Sort(names)
	want := []string{"/etc", "/etc/group", "/etc/nsswitch.conf", "/etc/passwd", "/etc/ssl", "/etc/ssl/certs", caBundle, "/home", "/home/nonroot", "/root", "/tmp"}
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("base files (-want +got):\n%s", diff)
	}
	if h := files["/home/nonroot"].hdr; h.Uid != nonroot || h.Gid != nonroot {
		t.Errorf("/home/nonroot owned by %d:%d, want nonroot's", h.Uid, h.Gid)
	}
	if h := files["/tmp"].hdr; h.Mode != 0o1777 {
		t.Errorf("/tmp mode %o, want sticky and world-writable", h.Mode)
	}
	if err := writeLayer(io.Discard, []file{{path: "etc/passwd"}}, created); err == nil {
		t.Error("a relative path was written")
	}
}

// TestDockerfileAgrees: the Dockerfile (docker-compose builds it) makes the
// image this builder makes: the same binaries from the same packages, the
// same user, ports and command.
func TestDockerfileAgrees(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	var got []binary
	for _, m := range regexp.MustCompile(`go build [^;&\n]*-o /out/(metabus[-a-z]*) (\./cmd/[a-z]+)`).FindAllStringSubmatch(text, -1) {
		got = append(got, binary{m[1], m[2]})
	}
	if diff := cmp.Diff(binaries, got, cmp.AllowUnexported(binary{})); diff != "" {
		t.Errorf("Dockerfile binaries (-builder +Dockerfile):\n%s", diff)
	}
	cfg := config(spec{})
	for _, want := range []string{
		"COPY --from=build /out/ " + binDir + "/",
		"USER " + cfg.User,
		"EXPOSE 9999 8081",
		"ENTRYPOINT []",
		`CMD ["` + cfg.Cmd[0] + `"]`,
	} {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(want) + `$`).MatchString(text) {
			t.Errorf("the Dockerfile lacks the line %q", want)
		}
	}
	if !slices.Equal(slices.Sorted(maps.Keys(cfg.ExposedPorts)), []string{"8081/tcp", "9999/tcp"}) {
		t.Errorf("builder exposes %v, the Dockerfile 9999 and 8081", cfg.ExposedPorts)
	}
}

// TestImage builds the image the way `make image` does (only the metabus
// binary, to keep it short), reads the tarball and the OCI layout back,
// checks its configuration and files, runs its metabus --version, which
// must say the version every manifest pins, and builds it again: the same
// digest.
func TestImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the metabus binary twice")
	}
	version, err := readVersion(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	s := spec{
		root:     repoRoot,
		version:  version,
		revision: "0123456789abcdef0123456789abcdef01234567",
		created:  time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		arch:     runtime.GOARCH,
		source:   defaultSource,
		binaries: []binary{{"metabus", "./cmd/metabus"}},
	}
	ref, err := name.NewTag("ghcr.io/metabus/metabus:"+version, name.StrictValidation)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	out := t.TempDir()
	r, err := build(ctx, s, ref, out)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("digest %s, %d bytes", r.digest, r.size)

	img, err := tarball.ImageFromPath(r.tarPath, &ref)
	if err != nil {
		t.Fatalf("reading the tarball back: %v", err)
	}
	if d, err := img.Digest(); err != nil || d != r.digest {
		t.Errorf("tarball image digest %v (%v), want %v", d, err, r.digest)
	}
	checkLayout(t, r, ref)

	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH || !cf.Created.Time.Equal(s.created) {
		t.Errorf("config os %s arch %s created %v", cf.OS, cf.Architecture, cf.Created)
	}
	c := cf.Config
	if c.User != "65532:65532" || len(c.Entrypoint) != 0 || !slices.Equal(c.Cmd, []string{"/usr/local/bin/metabus"}) {
		t.Errorf("user %q entrypoint %q cmd %q", c.User, c.Entrypoint, c.Cmd)
	}
	if _, ok := c.ExposedPorts["9999/tcp"]; !ok || len(c.ExposedPorts) != 2 {
		t.Errorf("exposed ports %v", c.ExposedPorts)
	}
	if !slices.ContainsFunc(c.Env, func(e string) bool {
		return strings.HasPrefix(e, "PATH=") && slices.Contains(strings.Split(strings.TrimPrefix(e, "PATH="), ":"), "/usr/local/bin")
	}) {
		t.Errorf("env %v: /usr/local/bin is not on PATH", c.Env)
	}
	wantLabels := map[string]string{
		"org.opencontainers.image.version":  version,
		"org.opencontainers.image.revision": s.revision,
		"org.opencontainers.image.created":  "2026-01-02T03:04:05Z",
		"org.opencontainers.image.source":   defaultSource,
		"org.opencontainers.image.title":    "metabus",
	}
	for k, v := range wantLabels {
		if c.Labels[k] != v {
			t.Errorf("label %s %q, want %q", k, c.Labels[k], v)
		}
	}
	for _, h := range cf.History {
		if !h.Created.Time.Equal(s.created) {
			t.Errorf("history %q created %v", h.CreatedBy, h.Created)
		}
	}

	rc := mutate.Extract(img)
	files := readTar(t, rc)
	rc.Close()
	checkFiles(t, files, s)

	// The binary as the image holds it, run here: what a Pod runs.
	bin := filepath.Join(t.TempDir(), "metabus")
	if err := os.WriteFile(bin, files["/usr/local/bin/metabus"].data, 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := exec.CommandContext(ctx, bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("metabus --version: %v: %s", err, got)
	}
	want := "metabus version " + version + " (revision " + s.revision + ", "
	if !strings.HasPrefix(string(got), want) {
		t.Errorf("metabus --version printed %q, want it to start with %q", got, want)
	}
	for pin, v := range manifestPins(t) {
		if v != version {
			t.Errorf("%s is %q, the image's binary says %q", pin, v, version)
		}
	}

	again, err := build(ctx, s, ref, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if again.digest != r.digest {
		t.Errorf("a second build of the same inputs has digest %s, the first %s", again.digest, r.digest)
	}
	a, errA := os.ReadFile(r.tarPath)
	b, errB := os.ReadFile(again.tarPath)
	if errA != nil || errB != nil || !bytes.Equal(a, b) {
		t.Errorf("the two tarballs differ (%v, %v)", errA, errB)
	}
}

// checkLayout reads the OCI layout back: one image, the build's, named by
// its tag.
func checkLayout(t *testing.T, r result, ref name.Tag) {
	t.Helper()
	idx, err := layout.ImageIndexFromPath(r.oci)
	if err != nil {
		t.Fatalf("reading the OCI layout back: %v", err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 1 || m.Manifests[0].Digest != r.digest ||
		m.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != ref.TagStr() {
		t.Fatalf("OCI layout index %+v, want the one image %s named %s", m.Manifests, r.digest, ref.TagStr())
	}
	img, err := idx.Image(r.digest)
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 2 {
		t.Errorf("layout image has %d layers (%v), want base and binaries", len(layers), err)
	}

	// What `crane push bin/image/oci <ref>` does (remote.Write of the
	// layout's image), to a registry in this process: the registry then
	// serves the digest the build printed, which a deployment pins.
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	dst, err := name.NewTag(strings.TrimPrefix(reg.URL, "http://")+"/metabus/metabus:"+ref.TagStr(), name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(dst, img); err != nil {
		t.Fatalf("pushing the layout's image: %v", err)
	}
	desc, err := remote.Head(dst)
	if err != nil {
		t.Fatal(err)
	}
	if desc.Digest != r.digest {
		t.Errorf("the registry serves %s as %s, the build printed %s", dst, desc.Digest, r.digest)
	}
}

// checkFiles checks the flattened image: users, the CA bundle, the
// binaries, every time the commit's.
func checkFiles(t *testing.T, files map[string]entry, s spec) {
	t.Helper()
	for p, e := range files {
		if !e.hdr.ModTime.Equal(s.created) {
			t.Errorf("%s mtime %v, want the commit's time %v", p, e.hdr.ModTime, s.created)
		}
	}
	if !strings.Contains(string(files["/etc/passwd"].data), "\nnonroot:x:65532:65532:") ||
		!strings.Contains(string(files["/etc/group"].data), "\nnonroot:x:65532:") {
		t.Errorf("no nonroot user 65532: passwd %q group %q", files["/etc/passwd"].data, files["/etc/group"].data)
	}
	ca := files[caBundle].data
	n := 0
	for block, rest := pem.Decode(ca); block != nil; block, rest = pem.Decode(rest) {
		if _, err := x509.ParseCertificate(block.Bytes); err != nil {
			t.Errorf("%s: certificate %d: %v", caBundle, n, err)
		}
		n++
	}
	if pool := x509.NewCertPool(); n < 100 || !pool.AppendCertsFromPEM(ca) {
		t.Errorf("%s holds %d certificates, want the NSS roots (over 100)", caBundle, n)
	}
	for _, b := range s.binaries {
		e, ok := files[binDir+"/"+b.name]
		if !ok {
			t.Errorf("no %s/%s", binDir, b.name)
			continue
		}
		if e.hdr.Typeflag != tar.TypeReg || e.hdr.Mode != 0o755 || e.hdr.Uid != 0 || len(e.data) == 0 {
			t.Errorf("%s: type %c mode %o uid %d, %d bytes; want a root-owned executable", b.name, e.hdr.Typeflag, e.hdr.Mode, e.hdr.Uid, len(e.data))
		}
		if !bytes.HasPrefix(e.data, []byte("\x7fELF")) {
			t.Errorf("%s is not an ELF executable", b.name)
		}
	}
}

// manifestPins reads the version each shipped manifest pins the image at
// (deploy/version_test.go holds every pin equal to VERSION; this test says
// the image's binary agrees with them).
func manifestPins(t *testing.T) map[string]string {
	t.Helper()
	read := func(path string, into any) {
		data, err := os.ReadFile(filepath.Join(repoRoot, path))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(data, into); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	read("deploy/helm/metabus/Chart.yaml", &chart)
	pins := map[string]string{"deploy/helm/metabus/Chart.yaml appVersion": chart.AppVersion}
	for _, k := range []string{"deploy/kustomization.yaml", "deploy/overlays/hardened/kustomization.yaml"} {
		var kust struct {
			Images []struct {
				Name   string `json:"name"`
				NewTag string `json:"newTag"`
			} `json:"images"`
		}
		read(k, &kust)
		for _, i := range kust.Images {
			if i.Name == "ghcr.io/metabus/metabus" {
				pins[k+" newTag"] = i.NewTag
			}
		}
	}
	if len(pins) != 3 {
		t.Errorf("found pins %v, want the chart's and both kustomizations'", pins)
	}
	return pins
}
