# shardkeeper Makefile. The two commands the README opens with:
#   make demo   runs the operator's main job on embedded defaults
#   make test   runs every test (what CI runs), the chaos suite's CI subset included
#   make chaos  runs every chaos scenario
#   make sim    runs the member simulator over 100,000 seeds
#   make mutate shows the simulator catching each protocol mutation
#   make mutate-real shows real-parts tests catching each (slow; not in make test)

SHELL := /usr/bin/env bash -o pipefail

# What the binaries report for --version and shardkeeper_build_info, and
# the images' tag: the release tag when HEAD is one (v0.1.0), else
# git describe's v0.1.0-3-gabc1234[-dirty].
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# Images `make docker-build` and `make oci-images` tag and
# `make install-manifest` pins: the version, never :latest.
IMAGE_REPO ?= shardkeeper
IMG ?= $(IMAGE_REPO):$(VERSION)
WORKER_IMG ?= $(IMAGE_REPO)-worker:$(VERSION)
# The images' base. Users get distroless (non-root, no shell); machines
# that cannot pull (the tests) pass BASE_IMAGE=scratch.
BASE_IMAGE ?= gcr.io/distroless/static:nonroot
# The CA bundle copied into the images, from the build host.
CA_BUNDLE ?= /etc/ssl/certs/ca-certificates.crt

REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)$(shell git diff --quiet HEAD 2>/dev/null || echo -dirty)
VERSION_PKG := github.com/shardkeeper/shardkeeper/internal/version
LDFLAGS := -X $(VERSION_PKG).version=$(VERSION) -X $(VERSION_PKG).revision=$(REVISION)
GOARCH ?= $(shell go env GOARCH)
# The images' build context: static binaries, CA bundle, LICENSE.
IMAGE_DIR := bin/image

.PHONY: all
all: generate build

##@ Development

.PHONY: generate
generate: ## Regenerate deepcopy code, the CRD and RBAC from markers, and the chart's copies of config/ (tests fail when either is stale).
	hack/generate.sh
	hack/chart-sync.sh

.PHONY: build
build: ## Build the operator and tools into bin/.
	go build -ldflags '$(LDFLAGS)' -o bin/ . ./cmd/...

.PHONY: vet
vet:
	go vet ./...

##@ The two README commands

.PHONY: test
test: deps vet ## Run every test, building and starting what they need.
	KUBEBUILDER_ASSETS="$$(hack/testbin.sh)" go test -count=1 -timeout 60m ./...

.PHONY: chaos
chaos: deps ## Run every chaos scenario (test/chaos) and print their summary table; make test runs only the CI subset.
	KUBEBUILDER_ASSETS="$$(hack/testbin.sh)" SHARDKEEPER_CHAOS=all go test -count=1 -timeout 120m -v -run TestChaos ./test/chaos/

.PHONY: sim
sim: ## Run the member simulator over 100,000 seeds (SEEDS=n) and print seeds run, faults by kind and violations; a failing seed is shrunk and replayable.
	go run ./pkg/worker/internal/sim/cmd/sim -seeds $${SEEDS:-100000}

.PHONY: mutate
mutate: ## Apply each protocol mutation and print the tables: mutation, the simulator check that caught it, seeds it took (at most 10,000 each); then the member's deterministic scripts that catch each (the simulator's known survivors included).
	go run ./pkg/worker/internal/sim/cmd/sim -mutate
	@out=$$(go test -count=1 -run 'TestEveryMutationIsCaughtByAScript$$' -v ./pkg/worker/internal/member/ 2>&1); rc=$$?; \
	  printf '%s\n' "$$out" | sed -n '/script table:/,/^---\|^=== \|^PASS\|^FAIL/p' | sed '/^---\|^=== \|^PASS\|^FAIL/d; s/^ *//; /script table:/d'; \
	  if [ $$rc -ne 0 ]; then printf '%s\n' "$$out" | grep -E 'FAIL|survived|caught by no' ; exit $$rc; fi

.PHONY: mutate-real
mutate-real: deps ## The real-parts half of make mutate (slow: not in make test or CI): each mutation applied to the real parts in turn, its chosen test run 3 times (RUNS=n); prints mutation, caught by, runs caught.
	KUBEBUILDER_ASSETS="$$(hack/testbin.sh)" go run ./pkg/worker/internal/mutatereal -runs $${RUNS:-3} $${ONLY:+-only $$ONLY}

.PHONY: bench
bench: deps ## Run the benchmarks of design.md section 10 (hack/bench) and print every row with its ratio; ROWS=a,c picks rows.
	hack/nats-servers.sh v2.14.9 >/dev/null
	KUBEBUILDER_ASSETS="$$(hack/testbin.sh)" go run ./hack/bench -rows "$${ROWS:-a,b,c,d,d2,e,e2}"

.PHONY: demo
demo: deps ## Run the demo: a local control plane, the operator and the sample.
	KUBEBUILDER_ASSETS="$$(hack/testbin.sh)" go run ./cmd/shardkeeper-demo $(DEMO_ARGS)

##@ Shipping

.PHONY: image-context
image-context: ## Build static linux binaries of the operator and the worker into bin/image with the CA bundle and LICENSE.
	@test -r "$(CA_BUNDLE)" || { echo "CA_BUNDLE $(CA_BUNDLE) is not readable: install ca-certificates or set CA_BUNDLE=<path to a PEM bundle>" >&2; exit 1; }
	mkdir -p $(IMAGE_DIR)
	CGO_ENABLED=0 GOOS=linux GOARCH=$(GOARCH) go build -trimpath -ldflags '-s -w $(LDFLAGS)' -o $(IMAGE_DIR)/ . ./cmd/shardkeeper-worker
	cp "$(CA_BUNDLE)" $(IMAGE_DIR)/ca-certificates.crt
	cp LICENSE $(IMAGE_DIR)/LICENSE

.PHONY: docker-build
docker-build: image-context ## Build the operator image IMG and the worker image WORKER_IMG (BASE_IMAGE=scratch to build offline).
	for target in operator worker; do \
		tag=$(IMG); [[ $$target == worker ]] && tag=$(WORKER_IMG); \
		docker build --file Dockerfile --target $$target \
			--build-arg BASE_IMAGE=$(BASE_IMAGE) --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) \
			--tag $$tag $(IMAGE_DIR) || exit 1; \
	done

.PHONY: docker-push
docker-push: ## Push IMG and WORKER_IMG.
	docker push $(IMG)
	docker push $(WORKER_IMG)

.PHONY: install-manifest
install-manifest: ## Render dist/install.yaml (config/default) and dist/install-namespaced.yaml (config/namespaced) with the operator image pinned to IMG.
	hack/install-manifest.sh "$(IMG)" dist/install.yaml
	hack/install-manifest.sh "$(IMG)" dist/install-namespaced.yaml config/namespaced

# Platforms of `make oci-images`.
PLATFORMS ?= linux/amd64 linux/arm64
OCI_DIR ?= bin/oci

.PHONY: oci-images
oci-images: ## Build both images for PLATFORMS as OCI image indexes in OCI_DIR, offline and without Docker (push: skopeo copy --all oci:bin/oci/shardkeeper:VERSION docker://...).
	@test -r "$(CA_BUNDLE)" || { echo "CA_BUNDLE $(CA_BUNDLE) is not readable: install ca-certificates or set CA_BUNDLE=<path to a PEM bundle>" >&2; exit 1; }
	mkdir -p $(IMAGE_DIR)
	for p in $(PLATFORMS); do \
		CGO_ENABLED=0 GOOS=$${p%/*} GOARCH=$${p#*/} go build -trimpath -ldflags '-s -w $(LDFLAGS)' \
			-o $(IMAGE_DIR)/$${p%/*}_$${p#*/}/ . ./cmd/shardkeeper-worker || exit 1; \
	done
	cp "$(CA_BUNDLE)" $(IMAGE_DIR)/ca-certificates.crt
	cp LICENSE $(IMAGE_DIR)/LICENSE
	go run ./hack/ocilayout -context $(IMAGE_DIR) -out $(OCI_DIR) -version $(VERSION) -revision $(REVISION) -platforms "$(PLATFORMS)"

RELEASE_DIR ?= dist

.PHONY: release
release: ## Write a release into RELEASE_DIR (dist/): install manifests pinned to VERSION, the Helm chart, the kubectl plugin archives, checksums and the krew manifest (VERSION=vX.Y.Z).
	VERSION="$(VERSION)" REVISION="$(REVISION)" IMAGE_REPO="$(IMAGE_REPO)" hack/release.sh "$(RELEASE_DIR)"

.PHONY: deps
deps: ## Install what the tests need from the machine's package manager.
	hack/deps.sh

.PHONY: help
help:
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z_-]+:.*?##/ { printf "  %-18s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)
