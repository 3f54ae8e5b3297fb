# framepackd build. Every target works on a fresh Debian 12 machine after `make setup`.
SHELL := /bin/bash
GO ?= go
export PATH := $(shell $(GO) env GOPATH)/bin:$(PATH)
BIN := $(CURDIR)/bin

# Pinned tool versions (make setup installs them with `go install`).
BUF_VERSION ?= v1.50.0
PROTOC_GEN_GO_VERSION ?= v1.36.6
PROTOC_GEN_GO_GRPC_VERSION ?= v1.5.1

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

proto: ## regenerate Go code from proto/
	cd $(CURDIR) && buf generate

lint:
	buf lint
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go' | grep -v '^proto/gen/'))" || { gofmt -l $$(git ls-files '*.go' | grep -v '^proto/gen/'); exit 1; }

clean:
	rm -rf $(BIN)
