#!/usr/bin/env bash
# gen-tools.sh regenerates tools/go.mod and tools/go.sum: a module that exists
# only to build etcd, kube-apiserver and kube-controller-manager from the Go
# module proxy. It is kept apart from the project's go.mod because building
# k8s.io/kubernetes needs a replace for every staging module, which would leak
# into anyone who imports metabus.
#
# Why the replaces: k8s.io/kubernetes' own go.mod points each k8s.io staging
# module at ./staging/src/..., which is not part of the module zip. Each one is
# pointed at its published v0.X.Y tag instead.
#
# Run it only to move to another Kubernetes version; CI uses the committed files.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/tools"
KUBE_VERSION=${KUBE_VERSION:-v1.36.3}
staging=v0${KUBE_VERSION#v1}
rm -f go.mod go.sum
go mod init metabus.dev/kubeenv-tools >/dev/null 2>&1
go mod edit -go=1.26.0
go mod download k8s.io/kubernetes@"$KUBE_VERSION"
kmod=$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/$KUBE_VERSION.mod
while read -r mod; do
	go mod edit -replace="$mod=$mod@$staging"
done < <(awk '$2 == "=>" && $3 ~ /^\.\/staging\// { print $1 }' "$kmod")
go mod edit -require=k8s.io/kubernetes@"$KUBE_VERSION"
# Pin etcd to the exact version Kubernetes is built and tested with; an
# unpinned etcd drags grpc and otel forward under the apiserver.
etcd=$(awk '$1 == "go.etcd.io/etcd/server/v3" { print $2 }' "$kmod")
go get -tool \
	k8s.io/kubernetes/cmd/kube-apiserver@"$KUBE_VERSION" \
	k8s.io/kubernetes/cmd/kube-controller-manager@"$KUBE_VERSION" \
	go.etcd.io/etcd/server/v3@"$etcd"
go mod tidy
echo "tools module: kubernetes $KUBE_VERSION (staging $staging), etcd $etcd" >&2
