package deploy

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// metabusImage is the repository every manifest pins.
const metabusImage = "ghcr.io/metabus/metabus"

// repoVersion reads the VERSION file at the repository's root: the one
// place the release version is written (`make build`, `make image` and the
// Dockerfile read it).
func repoVersion(t *testing.T) string {
	t.Helper()
	v := readFile(t, filepath.Join("..", "VERSION"))
	if !strings.HasSuffix(v, "\n") || strings.Count(v, "\n") != 1 {
		t.Errorf("VERSION %q is not one line", v)
	}
	v = strings.TrimSpace(v)
	if !matches(`^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$`, v) {
		t.Fatalf("VERSION %q is not a semantic version usable as an image tag", v)
	}
	return v
}

// TestOneVersion: every pin of the metabus image and the chart's versions
// equal the VERSION file, so bumping a release is editing VERSION and then
// the places this test names until it passes (docs/releasing.md). What the
// pins render to is TestVersioned's.
func TestOneVersion(t *testing.T) {
	version := repoVersion(t)
	chart := readDocs(t, filepath.Join(chartDir, "Chart.yaml"))[0]
	for _, f := range []string{"version", "appVersion"} {
		if got := str(chart, f); got != version {
			t.Errorf("%s/Chart.yaml %s %q, want VERSION's %q", chartDir, f, got, version)
		}
	}

	kustomizations, err := filepath.Glob(filepath.Join("overlays", "*", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range append([]string{"kustomization.yaml"}, kustomizations...) {
		n := 0
		for _, img := range slice(readDocs(t, k)[0], "images") {
			img := img.(map[string]any)
			if str(img, "name") != metabusImage {
				continue
			}
			n++
			if got := str(img, "newTag"); got != version {
				t.Errorf("%s: %s newTag %q, want VERSION's %q", k, metabusImage, got, version)
			}
		}
		if n != 1 {
			t.Errorf("%s sets %s %d times, want once", k, metabusImage, n)
		}
	}

	// docker-compose builds its metabus services from the Dockerfile,
	// which stamps VERSION; a pull of the published image would have to
	// name this version (the scan below).
	compose := mapping(readDocs(t, filepath.Join("..", "docker-compose.yaml"))[0], "x-service")
	if got := str(compose, "build", "dockerfile"); got != "Dockerfile" {
		t.Errorf("docker-compose.yaml services build from %q, want the Dockerfile", got)
	}
	if !strings.Contains(readFile(t, filepath.Join("..", "Dockerfile")), `version="${VERSION:-$(cat VERSION)}"`) {
		t.Error("the Dockerfile does not default the stamped version to the VERSION file")
	}

	// Any other pin, in a manifest, a script or a document (TestImagePinScan
	// shows what the scan finds).
	for file, tags := range imagePins(t, "..") {
		for _, tag := range tags {
			if tag != version {
				t.Errorf("%s pins %s:%s, want VERSION's %s", file, metabusImage, tag, version)
			}
		}
	}
}

// pinRE is a written reference to a tag of the metabus image, in YAML,
// shell, Markdown or a Dockerfile alike. Placeholders (<version>, $TAG)
// do not match.
var pinRE = regexp.MustCompile(regexp.QuoteMeta(metabusImage) + `:([0-9A-Za-z_][0-9A-Za-z_.-]*)`)

// imagePins returns the tags of the metabus image each file under root
// names as <image>:<tag>, except in Go tests (which render other tags on
// purpose), build output, local state and git's own files. The kustomizations' images:
// entries name the tag on a line of its own (newTag), checked apart.
func imagePins(t *testing.T, root string) map[string][]string {
	t.Helper()
	pins := map[string][]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", ".metabus", "bin", "node_modules":
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, "_test.go") || !d.Type().IsRegular() {
			return nil
		}
		// A manifest is small; a larger file is a stray build output
		// (`go build ./cmd/metabus` at the root), not worth reading.
		if info, err := d.Info(); err != nil || info.Size() > 4<<20 {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range pinRE.FindAllStringSubmatch(string(data), -1) {
			pins[path] = append(pins[path], strings.TrimRight(m[1], "."))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pins
}

// TestImagePinScan: the scan of TestOneVersion finds pins the ways the
// repository writes them and leaves placeholders alone.
func TestImagePinScan(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"a.yaml":          "image: ghcr.io/metabus/metabus:0.1.0\n",
		"b.md":            "crane push x ghcr.io/metabus/metabus:<version>\n`ghcr.io/metabus/metabus:0.2.0`.\n",
		"c.sh":            "docker run ghcr.io/metabus/metabus:$TAG\n",
		"d/e.yaml":        "image: \"ghcr.io/metabus/metabus:0.3.0-rc.1\"\n",
		"f_test.go":       "const img = \"ghcr.io/metabus/metabus:9.9.9\"\n",
		"bin/image/x.txt": "ghcr.io/metabus/metabus:7.7.7\n",
	}
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string][]string{
		filepath.Join(dir, "a.yaml"):   {"0.1.0"},
		filepath.Join(dir, "b.md"):     {"0.2.0"},
		filepath.Join(dir, "d/e.yaml"): {"0.3.0-rc.1"},
	}
	if diff := cmp.Diff(want, imagePins(t, dir)); diff != "" {
		t.Errorf("pins (-want +got):\n%s", diff)
	}
}

// TestImageDigest: pinned by digest (Helm image.digest, kustomize's
// images: digest, docs/releasing.md), every container running metabus
// takes repository@digest from either tool; the chart refuses a digest
// that is not sha256:<64 hex>.
func TestImageDigest(t *testing.T) {
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	want := metabusImage + "@" + digest
	helm, err := helmRender(map[string]any{"image": map[string]any{"digest": digest}}, defaultRelease)
	if err != nil {
		t.Fatal(err)
	}
	// An overlay on deploy/ as docs/releasing.md writes it.
	overlay := t.TempDir()
	abs, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	// kustomize takes a base by relative path only.
	base, err := filepath.Rel(overlay, abs)
	if err != nil {
		t.Fatal(err)
	}
	k := "resources:\n- " + base + "\nimages:\n- name: " + metabusImage + "\n  digest: " + digest + "\n"
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	kustomized, err := kustomizeBuild(overlay)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []render{{"helm image.digest", helm}, {"kustomize images: digest", kustomized}} {
		n := 0
		for _, o := range r.objs {
			spec := mapping(o, "spec", "template", "spec")
			for _, c := range append(slice(spec, "initContainers"), slice(spec, "containers")...) {
				if img := str(c.(map[string]any), "image"); strings.HasPrefix(img, metabusImage) {
					n++
					if img != want {
						t.Errorf("%s: %s/%s image %q, want %q", r.name, str(o, "kind"), str(o, "metadata", "name"), img, want)
					}
				}
			}
		}
		if n != 5 { // four services and the credential generator
			t.Errorf("%s: %d containers run metabus, want 5", r.name, n)
		}
	}
	for _, bad := range []string{"latest", "sha256:0123", "sha512:" + strings.Repeat("0", 128), digest + "\n"} {
		if _, err := helmRender(map[string]any{"image": map[string]any{"digest": bad}}, defaultRelease); err == nil {
			t.Errorf("image.digest %q was accepted", bad)
		}
	}
}
