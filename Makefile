# shardkeeper Makefile. The two commands the README opens with:
#   make demo   runs the operator's main job on embedded defaults
#   make test   runs every test (what CI runs), the chaos suite's CI subset included
#   make chaos  runs every chaos scenario

SHELL := /usr/bin/env bash -o pipefail

.PHONY: all
all: generate build

##@ Development

.PHONY: generate
generate: ## Regenerate deepcopy code, the CRD and RBAC from markers (hack/verify's test fails when they are stale).
	hack/generate.sh

.PHONY: build
build: ## Build the operator and tools into bin/.
	go build -o bin/ . ./cmd/...

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

.PHONY: demo
demo: deps ## Run the demo: a local control plane, the operator and the sample.
	KUBEBUILDER_ASSETS="$$(hack/testbin.sh)" go run ./cmd/shardkeeper-demo

.PHONY: deps
deps: ## Install what the tests need from the machine's package manager.
	hack/deps.sh

.PHONY: help
help:
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z_-]+:.*?##/ { printf "  %-18s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)
