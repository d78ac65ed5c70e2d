package deploy

import (
	"bufio"
	"bytes"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/metabus/metabus/pkg/natsx"
)

// natsServerModule is the module whose release every test, benchmark and
// fault suite runs (internal/testing/testnats builds it, the embedded mode links it).
const natsServerModule = "github.com/nats-io/nats-server/v2"

// goModVersion returns the version go.mod requires of module, and an error
// if it is missing or replaced (a replacement would make the version line
// say nothing about what is built).
func goModVersion(gomod []byte, module string) (string, error) {
	var version string
	inBlock := ""
	sc := bufio.NewScanner(bytes.NewReader(gomod))
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "//")
		f := strings.Fields(line)
		switch {
		case len(f) == 0:
			continue
		case len(f) == 2 && f[1] == "(":
			inBlock = f[0]
			continue
		case f[0] == ")":
			inBlock = ""
			continue
		}
		directive := inBlock
		if directive == "" {
			directive, f = f[0], f[1:]
		}
		if len(f) == 0 || f[0] != module {
			continue
		}
		switch directive {
		case "require":
			if len(f) != 2 {
				return "", fmt.Errorf("go.mod: require %s: want a version, got %q", module, line)
			}
			version = f[1]
		case "replace":
			return "", fmt.Errorf("go.mod replaces %s: the pinned image cannot be checked against a replacement", module)
		}
	}
	if version == "" {
		return "", fmt.Errorf("go.mod does not require %s", module)
	}
	return version, sc.Err()
}

func TestGoModVersion(t *testing.T) {
	for _, tc := range []struct {
		reason, gomod, want, wantErr string
	}{
		{reason: "in a require block", gomod: "module x\n\nrequire (\n\tgithub.com/a/b v1.0.0\n\tgithub.com/nats-io/nats-server/v2 v2.15.2\n)\n", want: "v2.15.2"},
		{reason: "a single require line, with a comment", gomod: "require github.com/nats-io/nats-server/v2 v2.14.1 // indirect\n", want: "v2.14.1"},
		{reason: "another module's prefix is not it", gomod: "require github.com/nats-io/nats-server/v2x v9.9.9\n", wantErr: "does not require"},
		{reason: "missing", gomod: "module x\n", wantErr: "does not require"},
		{reason: "replaced", gomod: "require github.com/nats-io/nats-server/v2 v2.15.2\nreplace github.com/nats-io/nats-server/v2 => ../nats-server\n", wantErr: "replaces"},
		{reason: "replaced in a block", gomod: "require github.com/nats-io/nats-server/v2 v2.15.2\nreplace (\n\tgithub.com/nats-io/nats-server/v2 v2.15.2 => github.com/fork/nats-server/v2 v2.15.3\n)\n", wantErr: "replaces"},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			got, err := goModVersion([]byte(tc.gomod), natsServerModule)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("version %q, want %q", got, tc.want)
			}
		})
	}
}

// natsImageRef finds references to a NATS server image: nats or
// [docker.io/][library/]nats, with a tag, a digest or neither (after
// image:), at the start of a word. A tag of digits alone is a host:port
// (nats://nats:4222), not an image; the tags the nats image is published
// under start with a digit, "latest", "alpine", "nightly" or "main", and
// anything else after "nats:" is a URI naming a subject (a hook's
// CloudEvents source "nats:hooks.x.sync"), not an image.
var (
	natsImageRef   = regexp.MustCompile(`(?:^|[\s"'=\[(,` + "`" + `])((?:docker\.io/)?(?:library/)?nats(?::(?:[0-9]|latest|alpine|nightly|main)[A-Za-z0-9_.\-]*|@sha256:[0-9a-f]+))`)
	natsImageNoTag = regexp.MustCompile(`(?m)\bimage:\s*["']?((?:docker\.io/)?(?:library/)?nats)["']?\s*$`)
	portOnly       = regexp.MustCompile(`^[^:]*:[0-9]+$`)
)

// natsImageRefs returns every NATS image text refers to.
func natsImageRefs(text string) []string {
	var out []string
	for _, m := range natsImageRef.FindAllStringSubmatch(text, -1) {
		if !portOnly.MatchString(m[1]) {
			out = append(out, m[1])
		}
	}
	for _, m := range natsImageNoTag.FindAllStringSubmatch(text, -1) {
		out = append(out, m[1])
	}
	return out
}

func TestNATSImageRefs(t *testing.T) {
	for _, tc := range []struct {
		reason, text string
		want         []string
	}{
		{reason: "a YAML image", text: "    image: nats:2.15.2-alpine\n", want: []string{"nats:2.15.2-alpine"}},
		{reason: "quoted, with its registry", text: `image: "docker.io/library/nats:2.12-alpine"`, want: []string{"docker.io/library/nats:2.12-alpine"}},
		{reason: "a floating tag", text: "--set nats.image=nats:latest", want: []string{"nats:latest"}},
		{reason: "a digest", text: "image: nats@sha256:0123abcd", want: []string{"nats@sha256:0123abcd"}},
		{reason: "no tag at all", text: "  image: nats\n", want: []string{"nats"}},
		{reason: "in Markdown code", text: "the image `nats:2.14.0-alpine` and (nats:2.13)", want: []string{"nats:2.14.0-alpine", "nats:2.13"}},
		{reason: "a URL's host and port is not an image", text: "--nats-url=nats://nats:4222 and nats:4222"},
		{reason: "a YAML key is not an image", text: "nats:\n  image: x\nnats: {tls: {enabled: true}}"},
		{reason: "another image ending in nats is not it", text: "image: example.com/my-nats:1.0 and natsbox:1"},
		{reason: "an error message is not an image", text: `"nats: not connected"`},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, natsImageRefs(tc.text)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestNATSImagePinnedToTestedServer: the NATS image is the release of
// nats-server go.mod requires, pinned to its patch, everywhere the
// repository names one (the StatefulSet, the chart's nats.image,
// docker-compose.yaml, the docs, anything added later), so that what is
// installed is the server every test, benchmark and fault suite ran, and
// bumping one without the others fails here.
func TestNATSImagePinnedToTestedServer(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	version, err := goModVersion(gomod, natsServerModule)
	if err != nil {
		t.Fatal(err)
	}
	if version != "v"+natsx.BuiltServerVersion {
		t.Fatalf("go.mod requires %s %s, but the server linked announces %s", natsServerModule, version, natsx.BuiltServerVersion)
	}
	if want := "nats:" + strings.TrimPrefix(version, "v") + "-alpine"; natsx.ServerImage != want {
		t.Fatalf("natsx.ServerImage %q, want %q", natsx.ServerImage, want)
	}
	self, err := filepath.Abs("natsversion_test.go") // its table names other images on purpose
	if err != nil {
		t.Fatal(err)
	}
	found := map[string][]string{}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if path == self || !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil || info.Size() > 4<<20 {
			return err // large files are data, not manifests
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if bytes.IndexByte(data, 0) >= 0 {
			return nil // a binary
		}
		if refs := natsImageRefs(string(data)); len(refs) > 0 {
			rel, _ := filepath.Rel(root, path)
			found[filepath.ToSlash(rel)] = refs
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for path, refs := range found {
		for _, ref := range refs {
			if ref != natsx.ServerImage {
				t.Errorf("%s names NATS image %q, want %q (the nats-server %s go.mod builds, which the tests run)", path, ref, natsx.ServerImage, version)
			}
		}
	}
	// The places that install NATS must be among those found: a pin
	// written in a form the search misses would go unchecked.
	for _, path := range []string{"deploy/nats/statefulset.yaml", "deploy/helm/metabus/values.yaml", "docker-compose.yaml", "docs/nats.md"} {
		if _, ok := found[path]; !ok {
			t.Errorf("no NATS image found in %s", path)
		}
	}
	t.Logf("%s in %v", natsx.ServerImage, slices.Sorted(maps.Keys(found)))
}
