# syntax=docker/dockerfile:1
#
# One image with every metabus binary:
#   /usr/local/bin/metabus-watcher, metabus-dispatcher, metabus-applier,
#   metabus-revisions and metabus (all services in one process, with an
#   embedded nats-server).
# Deployments choose the binary with `command`.

FROM golang:1.26 AS build
WORKDIR /src
# Dependencies first, so that source edits do not invalidate this layer.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
# The build's identity (pkg/version): `make image-docker` passes both; the
# version defaults to the VERSION file (what every manifest pins, as `make
# image` stamps it); .git is not in the build context, so Go cannot record
# the revision itself.
ARG VERSION=
ARG REVISION=unknown
# Static binaries (CGO_ENABLED=0) run on a distroless image without libc.
ENV CGO_ENABLED=0
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    set -eu; \
    version="${VERSION:-$(cat VERSION)}"; \
    v=github.com/metabus/metabus/pkg/version; \
    ldflags="-s -w -X $v.Version=${version} -X $v.Revision=${REVISION}"; \
    go build -trimpath -ldflags "$ldflags" -o /out/metabus-watcher ./cmd/watcher; \
    go build -trimpath -ldflags "$ldflags" -o /out/metabus-dispatcher ./cmd/dispatcher; \
    go build -trimpath -ldflags "$ldflags" -o /out/metabus-applier ./cmd/applier; \
    go build -trimpath -ldflags "$ldflags" -o /out/metabus-revisions ./cmd/revisions; \
    go build -trimpath -ldflags "$ldflags" -o /out/metabus ./cmd/metabus

# distroless/static: no shell, no package manager, CA certificates and
# tzdata only; "nonroot" runs as uid/gid 65532.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
USER 65532:65532
# metrics (--metrics-address), probes (--health-probe-bind-address)
EXPOSE 9999 8081
# No ENTRYPOINT, only a default CMD: Kubernetes `command` and docker-compose
# `command` (metabus-watcher ...) then both name the binary to run, found
# through distroless' PATH (/usr/local/bin is on it).
ENTRYPOINT []
CMD ["/usr/local/bin/metabus"]
