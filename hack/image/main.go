// Command image builds metabus's container image without a container
// engine (`make image`): the five binaries of the Dockerfile compiled
// static (CGO_ENABLED=0, -trimpath) and stamped with the version and
// revision (pkg/version), on a base made from nothing: /etc/passwd and
// /etc/group with the nonroot user 65532, the CA roots of the pinned Go
// module golang.org/x/crypto/x509roots/fallback and a sticky /tmp. Nothing
// is pulled.
//
// The build is reproducible: every time in the image (config, history,
// labels, every file's mtime) is the commit's time (SOURCE_DATE_EPOCH, or
// `git log -1 --format=%ct`), layers are written in a fixed order without
// user names or access times, and the Go build ignores the caller's
// GOAMD64/GOEXPERIMENT/GOFLAGS; the same commit, Go toolchain and
// architecture give the same digest.
//
// It writes <out>/metabus-<version>.tar (`docker load -i`, `crane push`)
// and the OCI image layout <out>/oci (`crane push`), and prints the
// image's digest. Run from the repository root:
//
//	go run ./hack/image [-version 0.1.0] [-revision SHA] [-tag TAG] [-arch amd64] [-out bin/image]
//
// The version defaults to the VERSION file, which every manifest's pin of
// ghcr.io/metabus/metabus must equal (deploy/version_test.go).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	root := fs.String("C", ".", "repository root")
	version := fs.String("version", "", "version stamped and labelled (default: the VERSION file)")
	revision := fs.String("revision", "", "git revision stamped and labelled (default: git rev-parse HEAD, -dirty when tracked files changed)")
	repo := fs.String("repository", "ghcr.io/metabus/metabus", "image repository")
	tag := fs.String("tag", "", "image tag (default: the version)")
	arch := fs.String("arch", runtime.GOARCH, "GOARCH of the image (linux/<arch>)")
	out := fs.String("out", "bin/image", "output directory")
	source := fs.String("source", defaultSource, "org.opencontainers.image.source")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	s := spec{root: *root, version: *version, revision: *revision, arch: *arch, source: *source, binaries: binaries}
	var err error
	if s.version == "" {
		if s.version, err = readVersion(*root); err != nil {
			return err
		}
	} else if s.version, err = parseVersion(s.version); err != nil {
		return err
	}
	if s.revision == "" {
		if s.revision, err = gitRevision(ctx, *root); err != nil {
			return err
		}
	}
	if s.created, err = sourceDate(ctx, *root); err != nil {
		return err
	}
	if *tag == "" {
		*tag = s.version
	}
	ref, err := name.NewTag(*repo+":"+*tag, name.StrictValidation)
	if err != nil {
		return fmt.Errorf("image reference: %w", err)
	}
	start := time.Now()
	r, err := build(ctx, s, ref, *out)
	if err != nil {
		return err
	}
	fmt.Printf("image %s (linux/%s, version %s, revision %s, created %s)\n", r.ref, s.arch, s.version, s.revision, s.created.Format(time.RFC3339))
	fmt.Printf("  digest  %s\n", r.digest)
	fmt.Printf("  size    %.1f MB compressed (manifest, config, layers)\n", float64(r.size)/1e6)
	fmt.Printf("  tarball %s (docker load -i; crane push)\n", r.tarPath)
	fmt.Printf("  layout  %s (crane push)\n", r.oci)
	fmt.Printf("  built in %s\n", time.Since(start).Round(100*time.Millisecond))
	return nil
}

// sourceDate is the image's time: SOURCE_DATE_EPOCH when set (the
// reproducible-builds convention), otherwise the time of the commit
// checked out.
func sourceDate(ctx context.Context, root string) (time.Time, error) {
	if v, ok := os.LookupEnv("SOURCE_DATE_EPOCH"); ok {
		return parseEpoch(v)
	}
	out, err := git(ctx, root, "log", "-1", "--format=%ct")
	if err != nil {
		return time.Time{}, fmt.Errorf("the commit time (set SOURCE_DATE_EPOCH outside a git work tree): %w", err)
	}
	return parseEpoch(out)
}

// gitRevision is HEAD, marked -dirty (as pkg/version marks a build Go
// stamped) when tracked files differ from it: the image then holds more
// than the commit.
func gitRevision(ctx context.Context, root string) (string, error) {
	rev, err := git(ctx, root, "rev-parse", "HEAD")
	if err != nil {
		return "", fmt.Errorf("the revision (pass -revision outside a git work tree): %w", err)
	}
	status, err := git(ctx, root, "status", "--porcelain", "--untracked-files=no")
	if err != nil {
		return "", fmt.Errorf("the work tree's state: %w", err)
	}
	if status != "" {
		rev += "-dirty"
	}
	return rev, nil
}

func git(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(ee.Stderr)))
		}
		return "", fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out)), nil
}
