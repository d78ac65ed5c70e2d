package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// binary is one program the image carries in /usr/local/bin.
type binary struct {
	name string // file name in /usr/local/bin
	pkg  string // Go package, relative to the repository root
}

// binaries are the programs of the image, the ones the Dockerfile builds:
// Deployments and docker-compose name them in their command.
var binaries = []binary{
	{"metabus-watcher", "./cmd/watcher"},
	{"metabus-dispatcher", "./cmd/dispatcher"},
	{"metabus-applier", "./cmd/applier"},
	{"metabus-revisions", "./cmd/revisions"},
	{"metabus", "./cmd/metabus"},
}

const (
	// versionPkg holds the link-time stamps --version and
	// metabus_build_info report.
	versionPkg = "github.com/metabus/metabus/pkg/version"
	binDir     = "/usr/local/bin"
	caBundle   = "/etc/ssl/certs/ca-certificates.crt"
	// nonroot is distroless' unprivileged user and group, which the
	// Deployments' runAsNonRoot and the Dockerfile's USER both assume.
	nonroot = 65532
	// defaultSource is the repository the image is built from
	// (org.opencontainers.image.source), the chart's home.
	defaultSource = "https://github.com/metabus/metabus"
)

// spec is everything an image is made of besides the source tree: the same
// spec on the same commit with the same Go toolchain gives the same digest.
type spec struct {
	root     string    // repository root
	version  string    // stamped into the binaries; the image's version label
	revision string    // git revision, stamped and labelled
	created  time.Time // the commit's time: config, history and every file's mtime
	arch     string    // GOARCH; the image is linux/<arch>
	source   string    // org.opencontainers.image.source
	binaries []binary
}

// result is what build wrote.
type result struct {
	ref     name.Tag
	digest  v1.Hash // the manifest's digest: what a registry will report
	size    int64   // manifest, config and compressed layers
	tarPath string  // docker load / crane push
	oci     string  // OCI image layout directory (crane push)
}

// versionRE is what a VERSION may be: a semantic version that is also a
// valid image tag (no build metadata: '+' is not allowed in a tag).
var versionRE = regexp.MustCompile(`^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$`)

// readVersion reads the repository's VERSION file: the one place the
// release version is written.
func readVersion(root string) (string, error) {
	data, err := os.ReadFile(filepath.Join(root, "VERSION"))
	if err != nil {
		return "", fmt.Errorf("reading the version: %w", err)
	}
	return parseVersion(string(data))
}

// parseVersion checks the content of a VERSION file: one semantic version,
// optionally followed by a newline.
func parseVersion(s string) (string, error) {
	v := strings.TrimSuffix(s, "\n")
	if !versionRE.MatchString(v) {
		return "", fmt.Errorf("VERSION %q is not a semantic version usable as an image tag (MAJOR.MINOR.PATCH[-PRERELEASE])", s)
	}
	return v, nil
}

// parseEpoch reads SOURCE_DATE_EPOCH (decimal seconds since 1970, UTC).
func parseEpoch(s string) (time.Time, error) {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n < 0 {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH %q is not a non-negative number of seconds", s)
	}
	return time.Unix(n, 0).UTC(), nil
}

// build compiles the binaries, lays them on the base and writes the image
// under out as <out>/metabus-<version>.tar and <out>/oci.
func build(ctx context.Context, s spec, ref name.Tag, out string) (result, error) {
	tmp, err := os.MkdirTemp("", "metabus-image-")
	if err != nil {
		return result{}, err
	}
	defer os.RemoveAll(tmp)
	bins := filepath.Join(tmp, "bin")
	if err := compile(ctx, s, bins); err != nil {
		return result{}, err
	}
	img, err := assemble(s, bins, tmp)
	if err != nil {
		return result{}, err
	}
	return write(img, ref, out, s.version)
}

// goEnv is the environment of the Go compiler for the image: a static
// linux/<arch> build whose output depends on the sources and the toolchain
// only, not on variables of the caller's shell that change code generation
// (GOAMD64, GOARM64, GOEXPERIMENT, cgo) or record the work tree (VCS stamps).
func goEnv(environ []string, arch string) []string {
	drop := map[string]bool{"CGO_ENABLED": true, "GOOS": true, "GOARCH": true, "GOFLAGS": true,
		"GOAMD64": true, "GOARM64": true, "GOARM": true, "GO386": true, "GOEXPERIMENT": true}
	var env []string
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		if !drop[k] {
			env = append(env, kv)
		}
	}
	return append(env, "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch, "GOFLAGS=-buildvcs=false",
		"GOAMD64=v1", "GOARM64=v8.0")
}

// ldflags stamps version and revision (pkg/version) and leaves the symbol
// table and DWARF out, as the Dockerfile does.
func ldflags(version, revision string) string {
	return fmt.Sprintf("-s -w -X %s.Version=%s -X %s.Revision=%s", versionPkg, version, versionPkg, revision)
}

// compile builds s.binaries into dir with one `go build` (packages are
// compiled once and linked in parallel), then names them as the image does.
func compile(ctx context.Context, s spec, dir string) error {
	if len(s.binaries) == 0 {
		return errors.New("no binaries to build")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// GO names the toolchain as the Makefile's GO does.
	goBin := os.Getenv("GO")
	if goBin == "" {
		goBin = "go"
	}
	args := []string{"build", "-trimpath", "-ldflags", ldflags(s.version, s.revision), "-o", dir + string(filepath.Separator)}
	for _, b := range s.binaries {
		args = append(args, b.pkg)
	}
	cmd := exec.CommandContext(ctx, goBin, args...)
	cmd.Dir = s.root
	cmd.Env = goEnv(os.Environ(), s.arch)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go %s: %w", strings.Join(args, " "), err)
	}
	// go build -o dir/ names each program after its package directory.
	for _, b := range s.binaries {
		built := filepath.Join(dir, filepath.Base(b.pkg))
		if built == filepath.Join(dir, b.name) {
			continue
		}
		if err := os.Rename(built, filepath.Join(dir, b.name)); err != nil {
			return fmt.Errorf("naming %s: %w", b.name, err)
		}
	}
	return nil
}

// file is one entry of a layer.
type file struct {
	path     string // absolute, without the leading slash in the tar
	mode     int64
	uid, gid int
	dir      bool
	data     []byte
	from     string // read data from this file instead
}

// caPEM is the CA bundle of the image: the NSS roots of the pinned module
// golang.org/x/crypto/x509roots/fallback, so the bundle changes only with a
// go.mod update, never with the build machine's /etc. Roots NSS trusts only
// for certificates issued before a date are left out: a PEM bundle cannot
// carry that constraint, and trusting them without it would trust more than
// NSS does.
func caPEM() ([]byte, int, error) {
	var buf bytes.Buffer
	n := 0
	for r := range bundle.Roots() {
		if r.Constraint != nil {
			continue
		}
		if err := pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: r.Certificate}); err != nil {
			return nil, 0, err
		}
		n++
	}
	if n == 0 {
		return nil, 0, errors.New("the CA bundle module holds no roots")
	}
	return buf.Bytes(), n, nil
}

// baseFiles is the image's system part, built from nothing: the users
// (root, nonroot 65532 and nobody), name service order, the CA bundle, a
// sticky /tmp and nonroot's home. No shell, no package manager.
func baseFiles() ([]file, error) {
	ca, _, err := caPEM()
	if err != nil {
		return nil, err
	}
	passwd := "root:x:0:0:root:/root:/sbin/nologin\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
		"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	group := "root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n"
	return []file{
		{path: "/etc", mode: 0o755, dir: true},
		{path: "/etc/group", mode: 0o644, data: []byte(group)},
		// Go's resolver reads it: /etc/hosts before DNS, as glibc would.
		{path: "/etc/nsswitch.conf", mode: 0o644, data: []byte("hosts: files dns\n")},
		{path: "/etc/passwd", mode: 0o644, data: []byte(passwd)},
		{path: "/etc/ssl", mode: 0o755, dir: true},
		{path: "/etc/ssl/certs", mode: 0o755, dir: true},
		{path: caBundle, mode: 0o644, data: ca},
		{path: "/home", mode: 0o755, dir: true},
		{path: "/home/nonroot", mode: 0o700, dir: true, uid: nonroot, gid: nonroot},
		{path: "/root", mode: 0o700, dir: true},
		{path: "/tmp", mode: 0o1777, dir: true},
	}, nil
}

// binaryFiles lists the compiled binaries of dir as image files.
func binaryFiles(dir string, bins []binary) []file {
	fs := []file{
		{path: "/usr", mode: 0o755, dir: true},
		{path: "/usr/local", mode: 0o755, dir: true},
		{path: binDir, mode: 0o755, dir: true},
	}
	for _, b := range bins {
		fs = append(fs, file{path: binDir + "/" + b.name, mode: 0o755, from: filepath.Join(dir, b.name)})
	}
	return fs
}

// writeLayer writes files as a gzipped tar to w, sorted by path, every
// entry with mtime t and no user or group names, gzip without a name or a
// time: the bytes depend on the files' contents and t only.
func writeLayer(w io.Writer, files []file, t time.Time) error {
	files = append([]file(nil), files...)
	sort.Slice(files, func(i, j int) bool { return files[i].path < files[j].path })
	zw, err := gzip.NewWriterLevel(w, gzip.BestCompression)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(zw)
	for _, f := range files {
		if !strings.HasPrefix(f.path, "/") {
			return fmt.Errorf("layer path %q is not absolute", f.path)
		}
		h := &tar.Header{
			Name:    strings.TrimPrefix(f.path, "/"),
			Mode:    f.mode,
			Uid:     f.uid,
			Gid:     f.gid,
			ModTime: t,
			// USTAR: no extended records (access or change times) that
			// a PAX or GNU header could add.
			Format: tar.FormatUSTAR,
		}
		data := f.data
		switch {
		case f.dir:
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		case f.from != "":
			if data, err = os.ReadFile(f.from); err != nil {
				return fmt.Errorf("layer file %s: %w", f.path, err)
			}
			fallthrough
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("layer file %s: %w", f.path, err)
		}
		if _, err := tw.Write(data); err != nil {
			return fmt.Errorf("layer file %s: %w", f.path, err)
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return zw.Close()
}

// layerFile writes files as a layer into path and opens it as an image
// layer (already compressed, so go-containerregistry never compresses it again).
func layerFile(path string, files []file, t time.Time) (v1.Layer, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := writeLayer(f, files, t); err != nil {
		f.Close()
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	return tarball.LayerFromFile(path, tarball.WithMediaType(types.DockerLayer))
}

// labels are the image's OCI annotations (as config labels, where `docker
// inspect`, registries and scanners read them).
func labels(s spec) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       "metabus",
		"org.opencontainers.image.description": "Metacontroller (metacontroller.k8s.io/v1alpha1) as microservices on NATS JetStream",
		"org.opencontainers.image.version":     s.version,
		"org.opencontainers.image.revision":    s.revision,
		"org.opencontainers.image.source":      s.source,
		"org.opencontainers.image.created":     s.created.Format(time.RFC3339),
	}
}

// config is the image's runtime configuration, the Dockerfile's: no
// entrypoint, so Kubernetes' and docker-compose's command names the binary;
// the all-in-one metabus by default; the metrics and probe ports.
func config(s spec) v1.Config {
	return v1.Config{
		User:         fmt.Sprintf("%d:%d", nonroot, nonroot),
		Env:          []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		Cmd:          []string{binDir + "/metabus"},
		ExposedPorts: map[string]struct{}{"9999/tcp": {}, "8081/tcp": {}},
		WorkingDir:   "/",
		Labels:       labels(s),
	}
}

// assemble lays the base and the binaries compiled into bins on an empty
// image; tmp holds the layer files.
func assemble(s spec, bins, tmp string) (v1.Image, error) {
	base, err := baseFiles()
	if err != nil {
		return nil, err
	}
	baseLayer, err := layerFile(filepath.Join(tmp, "base.tar.gz"), base, s.created)
	if err != nil {
		return nil, fmt.Errorf("base layer: %w", err)
	}
	binLayer, err := layerFile(filepath.Join(tmp, "bin.tar.gz"), binaryFiles(bins, s.binaries), s.created)
	if err != nil {
		return nil, fmt.Errorf("binaries layer: %w", err)
	}
	created := v1.Time{Time: s.created}
	// Docker media types (schema 2), which every registry and engine
	// takes: the docker-save tarball carries no manifest, and the one
	// `crane push` or a registry derives from it is schema 2 with these
	// descriptors, so the tarball and the OCI layout push to one digest.
	img := mutate.MediaType(empty.Image, types.DockerManifestSchema2)
	img = mutate.ConfigMediaType(img, types.DockerConfigJSON)
	img, err = mutate.Append(img,
		mutate.Addendum{Layer: baseLayer, History: v1.History{Created: created, CreatedBy: "hack/image: users, CA roots (golang.org/x/crypto/x509roots/fallback), /tmp", Comment: "base"}},
		mutate.Addendum{Layer: binLayer, History: v1.History{Created: created, CreatedBy: "hack/image: go build -trimpath -ldflags '" + ldflags(s.version, s.revision) + "' (CGO_ENABLED=0)", Comment: "binaries"}},
	)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Created = created
	cf.OS, cf.Architecture = "linux", s.arch
	cf.Config = config(s)
	return mutate.ConfigFile(img, cf)
}

// write saves img as a tarball `docker load` and `crane push` accept
// (tagged ref) and as an OCI image layout directory (the image annotated
// with its tag), replacing what an earlier build left there.
func write(img v1.Image, ref name.Tag, out, version string) (result, error) {
	r := result{ref: ref, tarPath: filepath.Join(out, "metabus-"+version+".tar"), oci: filepath.Join(out, "oci")}
	var err error
	if r.digest, err = img.Digest(); err != nil {
		return r, err
	}
	if r.size, err = imageSize(img); err != nil {
		return r, err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return r, err
	}
	if err := tarball.WriteToFile(r.tarPath, ref, img); err != nil {
		return r, fmt.Errorf("writing %s: %w", r.tarPath, err)
	}
	if err := os.RemoveAll(r.oci); err != nil {
		return r, err
	}
	p, err := layout.Write(r.oci, empty.Index)
	if err != nil {
		return r, fmt.Errorf("writing %s: %w", r.oci, err)
	}
	ann := map[string]string{
		"org.opencontainers.image.ref.name": ref.TagStr(),
		"io.containerd.image.name":          ref.Name(),
	}
	if err := p.AppendImage(img, layout.WithAnnotations(ann)); err != nil {
		return r, fmt.Errorf("writing %s: %w", r.oci, err)
	}
	return r, nil
}

// imageSize is what pushing img stores: manifest, config and compressed
// layers.
func imageSize(img v1.Image) (int64, error) {
	m, err := img.Manifest()
	if err != nil {
		return 0, err
	}
	raw, err := img.RawManifest()
	if err != nil {
		return 0, err
	}
	n := int64(len(raw)) + m.Config.Size
	for _, l := range m.Layers {
		n += l.Size
	}
	return n, nil
}
