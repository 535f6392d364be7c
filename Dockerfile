# Images of the operator (target operator, the default) and the reference
# worker (target worker), in the goreleaser pattern: nothing is compiled
# here. `make docker-build` builds static binaries on the host
# (CGO_ENABLED=0, -trimpath, version ldflags) and stages them, with the build
# host's CA bundle and the LICENSE, in bin/image, the build context:
#
#   make docker-build IMG=registry.example/shardkeeper:v0.1.0 \
#                     WORKER_IMG=registry.example/shardkeeper-worker:v0.1.0
#
# The context must hold both binaries whichever target is built: Docker's
# legacy builder (no BuildKit) builds every stage up to the target.
#
# BASE_IMAGE defaults to distroless static (non-root, no shell). Builds that
# cannot pull anything, such as the tests', pass BASE_IMAGE=scratch: the
# binaries need nothing from the base, since the CA bundle comes from here.
ARG BASE_IMAGE=gcr.io/distroless/static:nonroot

FROM ${BASE_IMAGE} AS base
ARG VERSION=dev
ARG REVISION=unknown
ARG SOURCE=https://github.com/shardkeeper/shardkeeper
LABEL org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.vendor="The shardkeeper authors"
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY LICENSE /licenses/LICENSE
# Numeric, so that the kubelet can enforce runAsNonRoot without a passwd
# file; the same uid as distroless's nonroot user and the manifests'
# runAsUser.
USER 65532:65532

FROM base AS worker
LABEL org.opencontainers.image.title="shardkeeper-worker" \
      org.opencontainers.image.description="shardkeeper reference worker: pulls its units from NATS JetStream and writes each row to PostgreSQL behind the claim's write guard"
COPY shardkeeper-worker /shardkeeper-worker
ENTRYPOINT ["/shardkeeper-worker"]

FROM base AS operator
LABEL org.opencontainers.image.title="shardkeeper" \
      org.opencontainers.image.description="shardkeeper operator: rolls shard topologies of NATS JetStream ingest fleets"
COPY shardkeeper /shardkeeper
ENTRYPOINT ["/shardkeeper"]
