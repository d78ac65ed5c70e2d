#!/usr/bin/env bash
# build.sh builds etcd, kube-apiserver and kube-controller-manager from the
# pinned tools module into a cache directory and prints that directory.
#
# The cache is keyed on the tools module's go.sum and this script, so a machine
# builds each Kubernetes version once (a cold build is ~5.5 min on 2 cores; a
# warm re-run only checks that the three binaries exist).
#
#   METABUS_CACHE   cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/metabus)
#   KUBE_BIN_DIR    if set and holding all three binaries, used as is
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

if [ -n "${KUBE_BIN_DIR:-}" ] && [ -x "$KUBE_BIN_DIR/etcd" ] && [ -x "$KUBE_BIN_DIR/kube-apiserver" ] \
	&& [ -x "$KUBE_BIN_DIR/kube-controller-manager" ]; then
	echo "$KUBE_BIN_DIR"
	exit 0
fi

root=${METABUS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/metabus}
key=$(cat "$here/tools/go.sum" "$here/build.sh" | sha256sum | cut -c1-16)
out=$root/kube/$key
if [ -x "$out/etcd" ] && [ -x "$out/kube-apiserver" ] && [ -x "$out/kube-controller-manager" ]; then
	echo "$out"
	exit 0
fi

mkdir -p "$out"
cd "$here/tools"
version=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
minor=$(echo "$version" | cut -d. -f2)
# Without the version stamps the binaries report v0.0.0-master and kubectl
# refuses to parse the server version.
ldflags="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags+=" -X $p.gitVersion=$version -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
done
start=$(date +%s)
echo "building kubernetes $version control plane into $out (first time on this machine: ~5-8 min)" >&2
# One go build so shared packages are compiled once. Build into a temporary
# directory and move into place so an interrupted build never looks complete.
tmp=$(mktemp -d "$out/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
go build -ldflags="$ldflags" -o "$tmp/" \
	k8s.io/kubernetes/cmd/kube-apiserver \
	k8s.io/kubernetes/cmd/kube-controller-manager \
	go.etcd.io/etcd/server/v3
# etcd's main package is its module root, so the binary is called "server".
mv "$tmp/server" "$out/etcd"
mv "$tmp/kube-controller-manager" "$out/kube-controller-manager"
mv "$tmp/kube-apiserver" "$out/kube-apiserver"
echo "built in $(( $(date +%s) - start ))s" >&2
echo "$out"
