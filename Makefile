# framepackd build. Every target works on a fresh Debian 12 machine after `make setup`.
SHELL := /bin/bash
GO ?= go
export PATH := $(shell $(GO) env GOPATH)/bin:$(PATH)
BIN := $(CURDIR)/bin

# Pinned tool versions (make setup installs them with `go install`).
# protoc-gen-go matches google.golang.org/protobuf in go.mod; protoc-gen-go-grpc
# v1.6 emits SupportPackageIsVersion9 (grpc >= v1.64).
BUF_VERSION ?= v1.75.0
PROTOC_GEN_GO_VERSION ?= v1.36.12
PROTOC_GEN_GO_GRPC_VERSION ?= v1.6.2

APT_PACKAGES := build-essential pkg-config libopenblas-dev ffmpeg

.PHONY: setup build test bench proto lint fuzz demo clean

setup: ## install what a fresh Debian 12 machine lacks
	@if ! dpkg -s $(APT_PACKAGES) >/dev/null 2>&1; then \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $(APT_PACKAGES); \
	fi
	$(GO) install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
	$(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	$(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

build: ## every binary into bin/
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./cmd/... ./workers/...

test: ## the whole suite
	$(GO) test -count=1 -timeout 30m ./...

bench: ## benchmark tables
	$(GO) test -run '^$$' -bench . -benchtime 3x ./...

proto: ## regenerate Go code from proto/ (stale *.pb.go removed first)
	cd $(CURDIR) && { find proto/gen/go -name '*.pb.go' -delete 2>/dev/null || true; } && buf generate

.PHONY: proto-check
proto-check: ## fail if proto/gen/go differs from what proto/ generates
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && cd $(CURDIR) && buf generate -o "$$tmp" && \
		diff -r -x '*_test.go' proto/gen/go "$$tmp/proto/gen/go" && echo 'proto/gen/go is current' || \
		{ echo 'proto/gen/go is stale: run make proto (tools from make setup)'; exit 1; }

lint: proto-check
	buf lint
	buf format --diff --exit-code
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go' | grep -v '^proto/gen/'))" || { gofmt -l $$(git ls-files '*.go' | grep -v '^proto/gen/'); exit 1; }

# demo: a short video from testdata/demo/start.png with the tiny test models (testdata/parity/models)
# on CPU: `make setup build`, then framepackd on a private socket, the CLI's generate, the daemon
# stopped. --resolution 96 picks the tiny models' bucket table (64x96, 80x80, 96x64); 2 s at
# window 3 is five sections (paddings 3,2,2,1,0) of 4 steps each.
DEMO_DIR ?= $(CURDIR)/build/demo
DEMO_PROMPT ?= The girl dances gracefully, with clear movements, full of charm.
demo: ## generate a short video on CPU with the bundled tiny models; prints the MP4's path
	@$(MAKE) --no-print-directory setup
	@$(MAKE) --no-print-directory build
	@set -euo pipefail; \
	rm -rf "$(DEMO_DIR)"; mkdir -p "$(DEMO_DIR)"; \
	sockdir=$$(mktemp -d /tmp/framepack-demo.XXXXXX); sock="$$sockdir/framepackd.sock"; \
	echo "demo: starting framepackd (log: $(DEMO_DIR)/framepackd.log)"; \
	"$(BIN)/framepackd" --models "$(CURDIR)/testdata/parity/models" --state "$(DEMO_DIR)/state" --socket "$$sock" \
		--backend cpu --lanes cpu --log-level warn 2>"$(DEMO_DIR)/framepackd.log" & \
	pid=$$!; \
	trap 'kill -TERM $$pid 2>/dev/null || true; wait $$pid 2>/dev/null || true; rm -rf "$$sockdir"' EXIT; \
	for i in $$(seq 300); do [ -S "$$sock" ] && break; kill -0 $$pid 2>/dev/null || { cat "$(DEMO_DIR)/framepackd.log"; exit 1; }; sleep 0.1; done; \
	start=$$(date +%s); \
	"$(BIN)/framepack" generate --addr "$$sock" --image "$(CURDIR)/testdata/demo/start.png" --prompt "$(DEMO_PROMPT)" \
		--seconds 2 --window 3 --steps 4 --resolution 96 --teacache=false --out "$(DEMO_DIR)/demo.mp4"; \
	echo "demo: done in $$(( $$(date +%s) - start )) s; the video is $(DEMO_DIR)/demo.mp4"

clean:
	rm -rf $(BIN)

.PHONY: native
native: ## compile native/ standalone with warnings as errors (a lint; cgo builds it for real)
	@mkdir -p build/native
	@set -e; for f in native/src/*.c native/cpu/*.c; do \
		echo "cc $$f"; \
		$(CC) -std=gnu11 -O2 -march=x86-64-v2 -Wall -Wextra -Werror -Inative/include -Inative/src -Inative/cpu \
			-c $$f -o build/native/$$(basename $$f .c).o; \
	done
