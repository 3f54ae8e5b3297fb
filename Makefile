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
# deploy-check: kubeconform, kustomize (v5.8.3 needs Go 1.27), and the Kubernetes release whose
# OpenAPI document (in the k8s.io/kubernetes module) gives the offline schemas.
KUBECONFORM_VERSION ?= v0.8.0
KUSTOMIZE_VERSION ?= v5.8.2
K8S_VERSION ?= 1.34.3
# protoc-gen-grpc-gateway and protoc-gen-openapiv2 (REST gateway and OpenAPI document), matching
# github.com/grpc-ecosystem/grpc-gateway/v2 in go.mod.
GRPC_GATEWAY_VERSION ?= v2.33.0

# What `make demo` and `make test` need on a fresh Debian 12: a C toolchain, OpenBLAS, ffmpeg.
APT_PACKAGES := build-essential pkg-config libopenblas-dev ffmpeg
# Debian 12's minimal HIP toolchain: compile-checks and links the gpu kernels for gfx1030/gfx90a
# (`make test` runs native-hip-check with it; `make setup-gpu` installs it).
APT_GPU_PACKAGES := hipcc libamdhip64-dev rocm-device-libs clang-15 lld-15
# The headless browser supervisor/web's page test drives (chromedp); `make setup-dev` installs it.
APT_TEST_PACKAGES := chromium

.PHONY: setup setup-test setup-dev setup-gpu build cli test soak long-cpu bench proto lint fuzz demo clean

# apt-install runs apt-get only for packages that are missing (sudo unless root).
define apt-install
	@if ! dpkg -s $(1) >/dev/null 2>&1; then \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $(1); \
	fi
endef

setup: ## what the CPU demo needs (C toolchain, OpenBLAS, ffmpeg); the generated proto code is committed
	$(call apt-install,$(APT_PACKAGES))

setup-gpu: ## the HIP toolchain for the gpu kernels (native-hip, native-hip-check)
	$(call apt-install,$(APT_GPU_PACKAGES))

setup-test: setup setup-gpu ## everything make test needs: the HIP toolchain, chromium, kubeconform and kustomize
	$(call apt-install,$(APT_TEST_PACKAGES))
	$(GO) install github.com/yannh/kubeconform/cmd/kubeconform@$(KUBECONFORM_VERSION)
	$(GO) install sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION)
	$(GO) mod download k8s.io/kubernetes@v$(K8S_VERSION)

setup-dev: setup-test ## also what make proto and make lint need: buf and the protoc plugins
	$(GO) install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
	$(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	$(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
	$(GO) install github.com/grpc-ecosystem/grpc-gateway/v2/protoc-gen-grpc-gateway@$(GRPC_GATEWAY_VERSION) \
		github.com/grpc-ecosystem/grpc-gateway/v2/protoc-gen-openapiv2@$(GRPC_GATEWAY_VERSION)

# The build's stamps (`framepack --version`, internal/buildinfo), from git: the version is
# `git describe` at a v* tag, else a Go pseudo-version (v0.0.0-<commit time>-<commit>); "+dirty"
# marks a tree with uncommitted changes. Without git they stay empty and the binaries fall back
# on what the Go toolchain embeds. Recursive (=): git runs only for the targets that build.
BUILDINFO := github.com/framepackd/framepackd/internal/buildinfo
GIT_DIRTY = $(shell git status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo +dirty)
GIT_COMMIT = $(shell git rev-parse HEAD 2>/dev/null)
GIT_TIME = $(shell git log -1 --format=%cI 2>/dev/null)
VERSION ?= $(shell git describe --tags --match 'v*' 2>/dev/null || TZ=UTC git log -1 --abbrev=12 \
	--date=format-local:%Y%m%d%H%M%S --format=v0.0.0-%cd-%h 2>/dev/null)
GO_LDFLAGS = -X $(BUILDINFO).Version=$(VERSION)$(GIT_DIRTY) -X $(BUILDINFO).Commit=$(GIT_COMMIT)$(GIT_DIRTY) \
	-X $(BUILDINFO).CommitTime=$(GIT_TIME)

build: ## every binary into bin/
	@mkdir -p $(BIN)
	$(GO) build -ldflags '$(GO_LDFLAGS)' -o $(BIN)/ ./cmd/... ./workers/...

cli: ## the CLI alone into bin/ (framepack: no daemon, no workers)
	@mkdir -p $(BIN)
	$(GO) build -ldflags '$(GO_LDFLAGS)' -o $(BIN)/ ./cmd/framepack

test: native-hip-check native-hip-emu deploy-check ## the whole suite (after make setup-test)
	$(GO) test -count=1 -timeout 30m ./...

soak: ## the 50-job fault soak (make test runs 8 jobs of it)
	$(GO) test -count=1 -timeout 60m -run '^TestFaultSoak$$' ./supervisor/watchdog -soak.jobs 50 -v

long-cpu: ## a 120-second job on the tiny models: the bytes each section writes stay flat (issue 30)
	$(GO) test -count=1 -timeout 120m -run '^TestLongJobLinearWrites$$' ./supervisor/pipeline -long.seconds 120 -v

bench: ## benchmark tables
	$(GO) test -run '^$$' -bench . -benchtime 3x ./...

proto: ## regenerate Go code from proto/ (stale *.pb.go removed first)
	cd $(CURDIR) && { find proto/gen/go -name '*.pb.go' -delete 2>/dev/null || true; } && buf generate

.PHONY: proto-check
proto-check: ## fail if proto/gen/go differs from what proto/ generates
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && cd $(CURDIR) && buf generate -o "$$tmp" && \
		diff -r -x '*_test.go' proto/gen/go "$$tmp/proto/gen/go" && \
		diff proto/gen/openapiv2/framepack.swagger.json "$$tmp/proto/gen/openapiv2/framepack.swagger.json" && echo 'proto/gen/go is current' || \
		{ echo 'proto/gen/go is stale: run make proto (tools from make setup-dev)'; exit 1; }

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

# ---- gpu backends (native/gpu: one CUDA-spelled source, HIP through fpk_gpu_compat.h) -------
GPU_CU := $(sort $(wildcard native/gpu/*.cu))
GPU_GLUE := native/gpu/fpk_gpu_backend.c
GPU_HDR := $(wildcard native/gpu/*.h) native/include/fpk.h native/src/fpk_impl.h
NATIVE_OUT := $(CURDIR)/build/native
NVCC ?= nvcc
# sm_80 (A100) and sm_90 (H100/H200) machine code, plus PTX of the newest for later chips.
CUDA_ARCHS ?= 80 90
HIPCC ?= hipcc
# Debian 12's hipcc (5.2) links gfx1030 and gfx90a; a full ROCm adds gfx1100 gfx1101 gfx1151 gfx942:
#   make native-hip HIPCC=/opt/rocm/bin/hipcc HIP_ARCHS="gfx1030 gfx90a gfx1100 gfx1101 gfx1151 gfx942"
HIP_ARCHS ?= gfx1030 gfx90a
GPU_CFLAGS := -O3 -fPIC -Inative/include -Inative/src -Inative/gpu

.PHONY: native-cuda native-hip native-hip-check native-hip-emu gpu-check

CUDA_OBJ := $(patsubst native/gpu/%.cu,$(NATIVE_OUT)/cuda/%.o,$(GPU_CU)) $(NATIVE_OUT)/cuda/fpk_gpu_backend.o
HIP_OBJ := $(patsubst native/gpu/%.cu,$(NATIVE_OUT)/hip/%.o,$(GPU_CU)) $(NATIVE_OUT)/hip/fpk_gpu_backend.o
GLUE_CFLAGS := -std=gnu11 -O2 -fPIC -fvisibility=hidden -Wall -Wextra -Werror -Inative/include -Inative/src -Inative/gpu

native-cuda: $(NATIVE_OUT)/libfpk-cuda.so ## libfpk-cuda.so (nvcc; copied next to the binaries in bin/)
	@mkdir -p $(BIN) && cp $< $(BIN)/

$(NATIVE_OUT)/libfpk-cuda.so: $(CUDA_OBJ)
	$(NVCC) -shared -cudart static -o $@ $^ -ldl

$(NATIVE_OUT)/cuda/%.o: native/gpu/%.cu $(GPU_HDR)
	@mkdir -p $(@D)
	$(NVCC) -std=c++17 -O3 -Xcompiler -fPIC -Xcompiler -fvisibility=hidden -Inative/include -Inative/src -Inative/gpu \
		$(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
		-gencode arch=compute_$(lastword $(CUDA_ARCHS)),code=compute_$(lastword $(CUDA_ARCHS)) -c $< -o $@

# -Werror only in CI's hip build: the GPU machine's compiler may know warnings ours does not
$(NATIVE_OUT)/cuda/fpk_gpu_backend.o: $(GPU_GLUE) $(GPU_HDR)
	@mkdir -p $(@D)
	$(CC) $(GLUE_CFLAGS) -Wno-error -c $< -o $@

$(NATIVE_OUT)/hip/fpk_gpu_backend.o: $(GPU_GLUE) $(GPU_HDR)
	@mkdir -p $(@D)
	$(CC) $(GLUE_CFLAGS) -c $< -o $@

native-hip: $(NATIVE_OUT)/libfpk-hip.so ## libfpk-hip.so (hipcc; copied next to the binaries in bin/)
	@mkdir -p $(BIN) && cp $< $(BIN)/

$(NATIVE_OUT)/libfpk-hip.so: $(HIP_OBJ)
	$(HIPCC) $(foreach a,$(HIP_ARCHS),--offload-arch=$(a)) -shared -Wl,--no-undefined -o $@ $^ -ldl

$(NATIVE_OUT)/hip/%.o: native/gpu/%.cu $(GPU_HDR)
	@mkdir -p $(@D)
	$(HIPCC) -x hip -std=c++17 $(GPU_CFLAGS) -DFPK_HIP -Wall -Werror -fvisibility=hidden \
		$(foreach a,$(HIP_ARCHS),--offload-arch=$(a)) -c $< -o $@

# CI's check that every kernel compiles for HIP (gfx1030, gfx90a) and that the library links
# with no undefined symbol; the CUDA vendor shims are compile-checked through hipcc too.
native-hip-check:
	@command -v $(HIPCC) >/dev/null || { echo "native-hip-check: $(HIPCC) not found (make setup-gpu installs Debian's hipcc)"; exit 1; }
	@$(MAKE) --no-print-directory -j2 $(NATIVE_OUT)/libfpk-hip.so $(NATIVE_OUT)/hip/vendor-cuda.o $(NATIVE_OUT)/hip/vendor-sdpa-cuda.o \
		$(foreach c,$(HIP_MATRIX_CHECK),$(NATIVE_OUT)/hip/attention-$(word 1,$(subst :, ,$(c))).s \
			$(NATIVE_OUT)/hip/conv-mma-$(word 1,$(subst :, ,$(c))).s) $(NATIVE_OUT)/hip/gemm-q-mma-gfx940.s
	@echo "native-hip-check: libfpk-hip.so links for $(HIP_ARCHS)"
	@s=$(NATIVE_OUT)/hip/gemm-q-mma-gfx940.s; e4=$$(grep -c "v_mfma_f32_16x16x32_fp8_fp8" $$s); e5=$$(grep -c "v_mfma_f32_16x16x32_fp8_bf8" $$s); \
		if [ "$$e4" -eq 0 ] || [ "$$e5" -eq 0 ]; then echo "native-hip-check: the fp8 x fp8 MFMA path is missing for gfx940 (fp8 $$e4, bf8 $$e5 instructions)"; exit 1; fi; \
		echo "native-hip-check: fp8 x fp8 v_mfma_f32_16x16x32 path compiles for gfx940 ($$e4 e4m3, $$e5 e5m2 weight instructions)"
	@for c in $(HIP_MATRIX_CHECK); do \
		arch=$${c%%:*}; ins=$${c#*:}; \
		for k in attention:flash conv-mma:conv; do \
			s=$(NATIVE_OUT)/hip/$${k%%:*}-$$arch.s; what=$${k#*:}; \
			f16=$$(grep -c "$${ins}_\?f16" $$s); bf16=$$(grep -c "$${ins}_\?bf16" $$s); \
			if [ "$$f16" -eq 0 ] || [ "$$bf16" -eq 0 ]; then \
				echo "native-hip-check: the $$what kernel's $$ins path is missing for $$arch (f16 $$f16, bf16 $$bf16 instructions)"; exit 1; fi; \
			echo "native-hip-check: $$what $$ins path compiles for $$arch ($$f16 f16, $$bf16 bf16 instructions)"; \
		done; \
	done

# The AMD matrix-core paths of the flash kernel (fpk_gpu_attention.cu) and of the channels-last
# conv (fpk_gpu_conv_mma.cu), compile-checked where Debian's clang 15 has them, device code of
# each file alone: MFMA for gfx90a (CDNA2, also in the library) and gfx940 (CDNA3; clang 15 does
# not know gfx942), WMMA for gfx1100 (RDNA3; Debian has no gfx11 device libraries: -nogpulib, no
# link). Each must contain its f16 and bf16 instructions, so a path that compiles away (a builtin
# the compiler lacks) fails the check.
HIP_MATRIX_CHECK := gfx90a:v_mfma_f32_16x16x16 gfx940:v_mfma_f32_16x16x16 gfx1100:v_wmma_f32_16x16x16

# The same kernels' device code run on the host (scripts/amdflashemu, scripts/convmmaemu; the
# conv's for its mma.sync path too): a thread (or fiber) per lane, the matrix instructions
# emulated from the fragment layouts the kernels assume, against a float64 reference — their
# logic, not the hardware's layouts (the on-device self-checks cover those).
native-hip-emu: ## host emulation of the matrix-core flash, conv and fp8 kernels (clang++-15, no GPU)
	scripts/amdflashemu/run.sh
	scripts/convmmaemu/run.sh
	scripts/fp8mmaemu/run.sh

$(NATIVE_OUT)/hip/attention-%.s: native/gpu/fpk_gpu_attention.cu $(GPU_HDR)
	@mkdir -p $(@D)
	$(HIPCC) -x hip -std=c++17 $(GPU_CFLAGS) -DFPK_HIP -Wall -Werror -Wno-unused-command-line-argument \
		--offload-arch=$* $(if $(filter gfx11%,$*),-nogpulib) --cuda-device-only -S $< -o $@

$(NATIVE_OUT)/hip/conv-mma-%.s: native/gpu/fpk_gpu_conv_mma.cu $(GPU_HDR)
	@mkdir -p $(@D)
	$(HIPCC) -x hip -std=c++17 $(GPU_CFLAGS) -DFPK_HIP -Wall -Werror -Wno-unused-command-line-argument \
		--offload-arch=$* $(if $(filter gfx11%,$*),-nogpulib) --cuda-device-only -S $< -o $@

# The fp8 x fp8 GEMM's CDNA3 path (fpk_gpu_gemm_q_mma.cu): MFMA 16x16x32 fp8/bf8, gfx940 (clang 15
# has the instructions but not gfx942; the code object for gfx942 needs a full ROCm's hipcc).
$(NATIVE_OUT)/hip/gemm-q-mma-%.s: native/gpu/fpk_gpu_gemm_q_mma.cu $(GPU_HDR)
	@mkdir -p $(@D)
	$(HIPCC) -x hip -std=c++17 $(GPU_CFLAGS) -DFPK_HIP -Wall -Werror -Wno-unused-command-line-argument \
		--offload-arch=$* -nogpulib --cuda-device-only -S $< -o $@

$(NATIVE_OUT)/hip/vendor-cuda.o: native/gpu/fpk_gpu_vendor.cu $(GPU_HDR)
	@mkdir -p $(NATIVE_OUT)/hip
	$(HIPCC) -x hip -std=c++17 $(GPU_CFLAGS) -DFPK_HIP -DFPK_VENDOR_CUDA -Wall -Werror --offload-arch=gfx1030 -c $< -o $@

$(NATIVE_OUT)/hip/vendor-sdpa-cuda.o: native/gpu/fpk_gpu_vendor_sdpa.cu $(GPU_HDR)
	@mkdir -p $(NATIVE_OUT)/hip
	$(HIPCC) -x hip -std=c++17 $(GPU_CFLAGS) -DFPK_HIP -DFPK_VENDOR_CUDA -Wall -Werror --offload-arch=gfx1030 -c $< -o $@

# On a machine with an NVIDIA GPU and nvcc: build libfpk-cuda.so there, run the carried test
# binaries on the cuda backend (every parity fixture, each conv tier forced), the memory-return
# check and the speed table against PyTorch. See scripts/gpu-check.sh.
gpu-check:
	scripts/gpu-check.sh

# The Kubernetes manifests, rendered by kustomize for every overlay and validated by kubeconform
# against schemas made offline from the k8s.io/kubernetes module's OpenAPI document
# (deploy/tools/k8sschema; kubeconform's default schemas are on GitHub, unreachable in CI) plus
# deploy/kubernetes/schemas (the ServiceMonitor subset). The Dockerfiles and compose.yaml are
# checked by `go test ./deploy/` (no container engine needed).
DEPLOY_OUT := $(CURDIR)/build/deploy
K8S_OVERLAYS := $(notdir $(wildcard deploy/kubernetes/overlays/*))

.PHONY: deploy-check
deploy-check: ## validate the rendered Kubernetes overlays with kubeconform (offline schemas)
	@command -v kubeconform >/dev/null && command -v kustomize >/dev/null || { echo "deploy-check: kubeconform/kustomize not found (make setup installs them)"; exit 1; }
	@rm -rf $(DEPLOY_OUT) && mkdir -p $(DEPLOY_OUT)
	@set -e; swagger=$$($(GO) mod download -json k8s.io/kubernetes@v$(K8S_VERSION) | sed -n 's/^\t"Dir": "\(.*\)",$$/\1/p')/api/openapi-spec/swagger.json; \
	for o in $(K8S_OVERLAYS); do kustomize build deploy/kubernetes/overlays/$$o > $(DEPLOY_OUT)/$$o.yaml; done; \
	$(GO) run ./deploy/tools/k8sschema -swagger "$$swagger" -out $(DEPLOY_OUT)/schemas/v$(K8S_VERSION)-standalone-strict $(DEPLOY_OUT)/*.yaml; \
	kubeconform -strict -summary -kubernetes-version $(K8S_VERSION) \
		-schema-location '$(DEPLOY_OUT)/schemas/{{.NormalizedKubernetesVersion}}-standalone{{.StrictSuffix}}/{{.ResourceKind}}{{.KindSuffix}}.json' \
		-schema-location 'deploy/kubernetes/schemas/{{.ResourceKind}}{{.KindSuffix}}.json' $(DEPLOY_OUT)/*.yaml

# ---- end-to-end benchmark (issues 17 and 30; scripts/gpue2e/README.md) ------------------------
.PHONY: gpu-e2e gpu-e2e-bundle gpu-e2e-dry e2e-cpu
E2E_DRY ?= /tmp/fpk-e2e-dry
gpu-e2e-bundle: ## here (with Go): the binaries and sources gpu-e2e needs, in carry-sized parts under build/e2e/ (prints the device calls)
	scripts/gpue2e/bundle.sh

gpu-e2e: ## on the GPU machine, once the bundle is staged: random full-size models, FramePack's modes, our budgets, the 60 s job, the report
	bash scripts/gpue2e/gpu-e2e.sh all

gpu-e2e-dry: gpu-e2e-bundle ## here: the device calls' sequence (stage every part, background runs, wait) on a cpu lane with the tiny models
	rm -rf $(E2E_DRY)
	D=$(E2E_DRY) LANE=cpu DEVICE_GIB=3 TINY=1 BUDGETS=keep,all,0.25 bash build/e2e/1/gpu-e2e.sh stage bg build bg models bg ours+long+report
	for n in $$(ls build/e2e | grep -E '^[0-9]+$$' | sort -n | tail -n +2); do D=$(E2E_DRY) bash build/e2e/$$n/gpu-e2e.sh stage || exit 1; done
	D=$(E2E_DRY) bash $(E2E_DRY)/gpu-e2e.sh wait 900

e2e-cpu: ## the same harness on the tiny models on a cpu lane: keep, all, a lane limit and a 5-section job (TestE2ECPU)
	$(GO) test -count=1 -run '^TestE2ECPU$$' -v ./scripts/gpue2e/e2e
