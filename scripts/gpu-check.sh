#!/usr/bin/env bash
# gpu-check.sh — the GPU acceptance run, on a machine with an NVIDIA GPU and nvcc (no Go needed).
#
#   scripts/gpu-bundle.sh            # here (with Go): test binaries, workers, gpubench, OpenBLAS → build/gpu
#   scripts/gpu-check.sh [phase...]  # there: phases build ops tests tiers attention attnbench memory bench (default: all)
#
# build   make native-cuda (libfpk-cuda.so for sm_$CUDA_ARCHS, default 90) into build/native
# ops     the runtime op tests on the cuda backend (FRAMEPACK_BACKEND=cuda), then the attention op
#         tests (cuDNN's fused SDPA where cuDNN 9 is found, flash matrix and FMA kernels, chunked,
#         the cpu round trip; f32, bf16, f16): no fixtures needed
# tests   the carried test binaries on the cuda backend: every parity case of every fixture twice: in f32 activations
#         (FRAMEPACK_ACTIVATION_DTYPE=f32; each case's tolerance) — vae, textenc, siglip and
#         transformer in process and through their worker processes (Load on
#         workertest.Backend(), the cuda backend here), the sampler's sample_hunyuan cases through
#         the transformer worker (and its UniPC replay), the pipeline fixture through the daemon
#         on a cuda:0 lane, the backend-independent rng, prep and tokenize cases — and in each
#         model's default 16-bit activations (transformer bf16, the rest fp16; rel_l2 <= 2e-2),
#         in process (TestParity*Half) and through the workers
# tiers   the VAE parity cases once per conv tier, each forced alone (FRAMEPACK_CONV_TIER)
# attention  every transformer, llama, clip and siglip parity case once per attention tier, each
#         forced alone
#         (FRAMEPACK_ATTENTION_TIER = flash, chunked, cpu)
# attnbench  the transformer's joint attention alone, ours (vendor, flash, chunked) against
#         PyTorch SDPA
# memory  NVML discovery, and a worker holding 40 GB killed: used memory back within 2 s
# cachebench one whole section with no step cache, TeaCache and MagCache (issue 33): cachebench.json
# vaecheck   conv op tests and the VAE parity cases with the vendor tiers forced (issue 18)
# vaebench   the VAE stages against PyTorch, and channels-last against NCDHW and heuristic convs
# vaeprofile per-op device time of one decode under an 8 GiB cap (VAE_PROFILE_STAGES: others)
# vaehalf    the VAE fixture cases in fp16 and bf16: ours, and the reference code (diffusers) on
#            this GPU in the same dtypes (scripts/gpubench/vae_half_ref.py)
# fp8     fp8 weights (issue 31): the runtime's fp8 tests (the fp8 x fp8 path must serve per-channel
#         weights: cuBLASLt FP8 on sm_89+), the fp8 fixture through the worker in f32 and bf16
#         activations per compute mode (weight_only, tensor, token), quantize-at-load, LoRA on fp8,
#         an e5m2 block-wise checkpoint, the footprint; with PyTorch and third_party_ref/ the
#         float64 reference testdata/reference/gen_fp8.py writes (copied to $OUT/fp8_reference)
#         and its parity test; then BenchmarkLinearFP8 (one Linear at full size: bf16 against fp8
#         weight-only, per tensor, per token); cuBLASLt's trace of TestLinearQ and one bench pass
#         says which fp8 matmuls ran (cublaslt-fp8.log, summarized: the direct bf16 output with
#         outer-vector scales, or the f32 fallback)
# bench   full-size speed table against PyTorch on the same GPU (scripts/gpubench), then a per-op
#         profile of the transformer (profile-transformer.json; BENCH_PROFILE=0 skips it), needs
#         third_party_ref/ (diffusers + FramePack's diffusers_helper sources, git-ignored; scripts/gpubench/third_party_ref.sh packs them)
#
# Logs and results go to $OUT (default build/gpu-check): log.txt, summary.txt, table.md,
# ours.json, torch.json. Exit status: non-zero when a phase failed.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/build/gpu-check}
mkdir -p "$OUT"
BUNDLE=$ROOT/build/gpu               # carried, compressed
BIN=${GPU_CHECK_BIN:-/tmp/fpk-gpu-bin} # unpacked here, so the carried folder stays small
LOG=$OUT/log.txt
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
phases=("$@")
[ ${#phases[@]} -eq 0 ] && phases=(build ops tests tiers attention attnbench memory bench)

say() { echo "$*" | tee -a "$SUMMARY"; }
status=0

# ---- environment ------------------------------------------------------------------------------
mkdir -p "$BIN/lib"
for a in tests bench; do # what the run carries of scripts/gpu-bundle.sh's archives, once
	[ -e "$BUNDLE/$a.tar.xz" ] && [ ! -e "$BIN/.$a" ] && tar -C "$BIN" -xJf "$BUNDLE/$a.tar.xz" && touch "$BIN/.$a"
done
for f in "$BUNDLE"/lib/*.xz; do
	[ -e "$f" ] || continue
	rel=${f#"$BUNDLE"/}
	[ -e "$BIN/${rel%.xz}" ] || xz -dc "$f" >"$BIN/${rel%.xz}"
done
chmod +x "$BIN"/*.test "$BIN"/gpubench 2>/dev/null
export LD_LIBRARY_PATH="$BIN/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# cuDNN (and cuBLAS when the toolkit has none) from PyTorch's wheels: their folders join the
# loader's path; the backend still prefers the CUDA toolkit's root for what it has.
if NV=$(python3 -c 'import nvidia, os; print(list(nvidia.__path__)[0])' 2>/dev/null); then
	for d in $(find "$NV" -name 'libcudnn.so.9' -o -name 'libcublas.so.1[23]' 2>/dev/null | xargs -r -n1 dirname | sort -u); do
		LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
	done
	# cuDNN's fused attention compiles its kernels at run time: NVRTC from the wheels too
	for d in $(find "$NV" -name 'libnvrtc.so*' 2>/dev/null | xargs -r -n1 dirname | sort -u); do
		LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
	done
fi
CUDNN_DIR=$(find "${NV:-/nonexistent}" /usr/local/cuda/lib64 -name 'libcudnn.so.9' 2>/dev/null | head -1)
export FRAMEPACK_NATIVE_DIR=$ROOT/build/native
export FRAMEPACK_FIXTURES=$ROOT/testdata/parity
export FRAMEPACK_REFERENCE_FIXTURES=$ROOT/testdata/reference
export FRAMEPACK_BACKEND=${FRAMEPACK_BACKEND:-cuda}

run() { # name timeout cmd... : runs in the current dir, logs, records pass/fail
	local name=$1 limit=$2
	shift 2
	local t0=$SECONDS
	echo "=== $name: $*" >>"$LOG"
	timeout "$limit" "$@" >>"$LOG" 2>&1
	local rc=$?
	if [ $rc -eq 0 ]; then say "PASS $name ($((SECONDS - t0)) s)"; else
		say "FAIL $name (rc $rc, $((SECONDS - t0)) s)"
		status=1
	fi
	return $rc
}

# runs a carried test binary from its package folder (tests read testdata/ relative to it)
gotest() { # name pkgdir binary limit args...
	local name=$1 dir=$2 bin=$3 limit=$4
	shift 4
	(cd "$ROOT/$dir" && run "$name" "$limit" "$BIN/$bin" -test.count=1 -test.timeout="${limit}s" "$@")
	local rc=$?
	[ $rc -ne 0 ] && status=1
	return $rc
}

# worker tests build their workers through internal/testbin, and this machine has no go:
# scripts/fakego/go answers it with the carried <model>-worker binaries
use_workers() {
	chmod +x "$BIN"/*-worker 2>/dev/null
	export GPU_CHECK_BIN=$BIN PATH="$ROOT/scripts/fakego:$PATH"
}

# One line per kind of cuBLASLt FP8 matmul in a CUBLASLT_LOG_FILE (phase fp8): its count, D's
# descriptor, the scale modes and the epilogue as the trace names them; the trace's first lines
# when it has none in that form, and its errors.
lt_fp8_summary() {
	local f=$1
	if [ ! -s "$f" ]; then
		echo "cuBLASLt fp8 trace: no log written ($f)"
		return
	fi
	echo "cuBLASLt fp8 matmuls (count, D, scale modes, epilogue):"
	local lines
	lines=$(grep 'cublasLtMatmul\]' "$f" | grep 'R_8F' | while IFS= read -r l; do
		d=$(grep -o 'Ddesc=\[[^]]*\]' <<<"$l" | head -1 | sed -E 's/ (ld|order|batchCount|strideB?|batchStride)=[^] ]*//g')
		m=$(grep -oiE '[a-z]*(scalemode|scale_mode|epilogue)[a-z]*=[A-Za-z0-9_]+' <<<"$l" | tr '\n' ' ')
		echo "$d $m"
	done | sort | uniq -c | sort -rn | head -20)
	if [ -n "$lines" ]; then echo "$lines"; else grep -m3 'R_8F' "$f" | cut -c1-700; fi
	grep -m5 -i '\[error\]' "$f" | cut -c1-400
}

for phase in "${phases[@]}"; do
	case $phase in
	build)
		nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader | tee -a "$SUMMARY"
		nvcc --version | tail -2 >>"$SUMMARY"
		if command -v make >/dev/null; then
			run "make native-cuda" 590 make --no-print-directory -j"$(nproc)" native-cuda CUDA_ARCHS="${CUDA_ARCHS:-90}" GO=true
		else
			mkdir -p build/native/cuda
			run "cc glue" 60 cc -std=gnu11 -O2 -fPIC -fvisibility=hidden -Wall -Inative/include -Inative/src -Inative/gpu \
				-c native/gpu/fpk_gpu_backend.c -o build/native/cuda/fpk_gpu_backend.o &&
				run "nvcc libfpk-cuda.so" 590 nvcc -std=c++17 -O3 -Xcompiler -fPIC -Xcompiler -fvisibility=hidden -cudart static \
					-gencode "arch=compute_${CUDA_ARCHS:-90},code=sm_${CUDA_ARCHS:-90}" -Inative/include -Inative/src -Inative/gpu \
					-shared -o build/native/libfpk-cuda.so native/gpu/*.cu build/native/cuda/fpk_gpu_backend.o -ldl
		fi
		;;
	ops)
		gotest "runtime ops on $FRAMEPACK_BACKEND" internal/runtime runtime.test 300 -test.v
		grep -E "^(--- FAIL|FAIL|ok|PASS)" "$LOG" | tail -5 >>"$SUMMARY"
		# where cuDNN 9 was found, the vendor tier (cuDNN's fused SDPA) must serve the models'
		# shapes in the op tests rather than decline them
		[ -n "$CUDNN_DIR" ] && export FRAMEPACK_TEST_VENDOR_ATTENTION=1
		gotest "attention op tests" internal/runtime runtime.test 300 -test.run 'Attention' -test.v
		unset FRAMEPACK_TEST_VENDOR_ATTENTION
		FRAMEPACK_GPU_FLASH_FMA=1 gotest "attention op tests, flash FMA kernel forced" internal/runtime runtime.test 300 \
			-test.run 'AttentionTiers|AttentionHalf' -test.v
		;;
	tests)
		use_workers
		# pass 1, f32 activations everywhere (FRAMEPACK_ACTIVATION_DTYPE=f32: every case at its own
		# tolerance); the in-process TestParity*Half tests still run their model's 16-bit dtype
		export FRAMEPACK_ACTIVATION_DTYPE=f32
		gotest "parity vae (f32)" workers/vae/causalvae causalvae.test 300 -test.run '^TestParity' -test.v
		gotest "parity vae worker (f32)" workers/vae vae.test 300 -test.run '^TestParity' -test.v
		gotest "parity textenc (f32)" workers/textenc textenc.test 300 -test.run '^TestParity' -test.v
		gotest "parity textenc tokenize" internal/tokenizer tokenizer.test 120 -test.run '^TestParity' -test.v
		gotest "parity siglip (f32)" workers/clipvision/siglip siglip.test 300 -test.run 'Parity' -test.v
		gotest "parity siglip worker (f32)" workers/clipvision clipvision.test 300 -test.run 'Parity' -test.v
		gotest "parity transformer (f32)" workers/transformer/dit dit.test 300 -test.run '^TestParity' -test.v
		# sample_hunyuan (TestWorkerParitySampler) and transformer.forward (TestParityTransformerWorker*)
		# through the transformer worker
		gotest "parity sampler and transformer worker (f32)" workers/transformer transformer.test 300 -test.run 'Parity' -test.v
		gotest "parity sampler (sigmas, UniPC replay)" workers/transformer/sampler sampler.test 120 -test.run '^TestParity' -test.v
		gotest "parity rng" internal/torchrng torchrng.test 120 -test.run '^TestParity' -test.v
		gotest "parity prep" internal/imageproc imageproc.test 120 -test.run '^TestParity' -test.v
		gotest "parity pipeline: i2v, Studio end frame + timed prompts, F1 (daemon, $FRAMEPACK_BACKEND lane, f32)" supervisor/pipeline pipeline.test 300 -test.run '^TestParityPipeline(Studio|F1)?$' -test.v
		# pass 2, each model's default 16-bit activations on the GPU (transformer bf16, the rest
		# fp16; every case within 2e-2): in process, and through the workers (their checks follow
		# the dtype Load reports)
		unset FRAMEPACK_ACTIVATION_DTYPE
		gotest "parity vae (fp16)" workers/vae/causalvae causalvae.test 300 -test.run '^TestParityVAEHalf$' -test.v
		gotest "parity vae worker (default: fp16)" workers/vae vae.test 300 -test.run '^TestParityVAE$' -test.v
		[ -e "$BIN/llama.test" ] && gotest "parity llama (fp16)" workers/textenc/llama llama.test 300 -test.run 'Half$' -test.v
		[ -e "$BIN/clip.test" ] && gotest "parity clip text (fp16)" workers/textenc/clip clip.test 300 -test.run 'Half$' -test.v
		gotest "parity textenc worker (default: fp16)" workers/textenc textenc.test 300 -test.run '^TestParityTextenc$' -test.v
		gotest "parity siglip (fp16)" workers/clipvision/siglip siglip.test 300 -test.run '^TestParitySiglipHalf$' -test.v
		gotest "parity siglip worker (default: fp16)" workers/clipvision clipvision.test 300 -test.run '^TestParitySiglip$' -test.v
		gotest "parity transformer (bf16)" workers/transformer/dit dit.test 300 -test.run '^TestParityTransformerHalf$' -test.v
		gotest "parity transformer worker (default: bf16)" workers/transformer transformer.test 300 -test.run '^TestParityTransformerWorker$' -test.v
		;;
	tiers)
		# TestParityVAE is f32; TestParityVAEHalf the 16-bit default (fp16)
		for tier in vendor_tuned vendor_default own_kernel cpu; do
			FRAMEPACK_CONV_TIER=$tier gotest "parity vae, conv tier $tier forced" workers/vae/causalvae causalvae.test 300 \
				-test.run '^TestParityVAE(Half)?$' -test.v
		done
		;;
	attention)
		# (vendor is not forced here: it takes 16-bit q, k, v only and the parity runs are f32;
		# the chain's own runs serve 16-bit attention through it)
		for tier in flash chunked cpu; do
			export FRAMEPACK_ATTENTION_TIER=$tier
			[ -e "$BIN/dit.test" ] && gotest "parity transformer, attention $tier" workers/transformer/dit dit.test 300 -test.run '^TestParity' -test.v
			# (a run may carry fewer binaries: the device machine's tree limit)
			[ -e "$BIN/llama.test" ] && gotest "parity llama, attention $tier" workers/textenc/llama llama.test 300 -test.run '^TestParity' -test.v
			[ -e "$BIN/clip.test" ] && gotest "parity clip text, attention $tier" workers/textenc/clip clip.test 300 -test.run '^TestParity' -test.v
			[ -e "$BIN/siglip.test" ] && gotest "parity siglip, attention $tier" workers/clipvision/siglip siglip.test 300 -test.run 'Parity' -test.v
		done
		unset FRAMEPACK_ATTENTION_TIER
		;;
	attnbench)
		# the transformer's joint attention alone (18,083 tokens, 24 × 128, bf16): ours per tier
		# against PyTorch's SDPA on the same GPU
		gotest "attention benchmark (ours)" internal/runtime runtime.test 300 -test.run '^$' -test.bench AttentionDiT -test.benchtime 5x
		grep -E "^BenchmarkAttentionDiT|AttentionDiT/vendor" "$LOG" | tail -3 >>"$SUMMARY"
		run "attention benchmark (pytorch sdpa)" 120 python3 scripts/gpubench/attn_bench.py
		grep -E "^pytorch sdpa" "$LOG" | tail -1 >>"$SUMMARY"
		;;
	memory)
		gotest "devices: nvml, memory returned after kill" internal/devices devices.test 240 \
			-test.run 'TestNVMLReal|TestVRAMReturnedAfterKill' -test.v
		grep -E "baseline .* back in|device [0-9]+:" "$LOG" | tail -3 >>"$SUMMARY"
		;;
	bench)
		[ -d third_party_ref ] || tar -xJf "$BUNDLE/third_party_ref.tar.xz"
		B=${BENCH_DIR:-/tmp/fpk-bench}
		mkdir -p "$B"
		export PYTHONUNBUFFERED=1
		run "bench manifests" 300 python3 scripts/gpubench/torch_bench.py --out "$B" --manifests-only
		# ours as FramePack computes: weights and activations in each model's dtype (transformer
		# bf16, the rest fp16), f32 accumulation
		run "bench ours" "${BENCH_OURS_LIMIT:-420}" "$BIN/gpubench" -dir "$B" ${BENCH_STAGES:+-stages $BENCH_STAGES}
		run "bench pytorch" "${BENCH_TORCH_LIMIT:-420}" python3 scripts/gpubench/torch_bench.py --out "$B" ${BENCH_STAGES:+--stages $BENCH_STAGES}
		cp "$B"/ours.json "$B"/torch.json "$OUT"/ 2>/dev/null
		python3 scripts/gpubench/table.py "$B" "$OUT/bench.json" "${BENCH_COMMIT:-}" | tee "$OUT/table.md" >>"$SUMMARY"
		# where the transformer's time goes, per op (a stream sync after every op: after the timed
		# runs, never in them; BENCH_PROFILE=0 skips it)
		if [ "${BENCH_PROFILE:-1}" = 1 ] && [[ ",${BENCH_STAGES:-transformer}," == *,transformer,* ]]; then
			run "bench profile (transformer)" "${BENCH_PROFILE_LIMIT:-300}" "$BIN/gpubench" -dir "$B" -stages transformer -profile
			cp "$B"/profile-transformer.json "$OUT"/ 2>/dev/null
			sed -n '/^profile transformer/,/^$/p' "$LOG" | head -40 >>"$SUMMARY"
		fi
		;;
	features)
		# issue 33: MagCache (its skipped steps), keyframes and video extension through the daemon
		# on a cuda:0 lane against the float64 references (testdata/reference), in f32
		# activations and in the models' default 16-bit ones
		use_workers
		FRAMEPACK_ACTIVATION_DTYPE=f32 gotest "parity pipeline features: MagCache, keyframes, video extension (f32)" supervisor/pipeline \
			pipeline.test 400 -test.run 'TestParityPipeline(MagCache|Keyframes|Video)|TestMagCacheFixtureMatters' -test.v
		gotest "parity pipeline features: MagCache, keyframes, video extension (16-bit)" supervisor/pipeline \
			pipeline.test 400 -test.run 'TestParityPipeline(MagCache|Keyframes|Video)|TestMagCacheFixtureMatters' -test.v
		grep -E "rel_l2|skipped|SKIP" "$LOG" | grep -iE "magcache|keyframe|video" | tail -30 >>"$SUMMARY"
		;;
	cachebench)
		# issue 33: one whole section (25 steps, 544x704, window 9) with no step cache, TeaCache and
		# MagCache, in one run on this GPU (random weights: TeaCache's skips follow the data)
		[ -d third_party_ref ] || tar -xJf "$BUNDLE/third_party_ref.tar.xz"
		B=${BENCH_DIR:-/tmp/fpk-bench}
		mkdir -p "$B"
		export PYTHONUNBUFFERED=1
		[ -e "$B/transformer/config.json" ] || run "bench manifests" 300 python3 scripts/gpubench/torch_bench.py --out "$B" --manifests-only
		run "bench step caches" "${CACHEBENCH_LIMIT:-580}" "$BIN/gpubench" -dir "$B" -stages section_nocache,section_teacache,section_magcache
		cp "$B"/ours.json "$OUT"/cachebench.json 2>/dev/null
		grep -E '^ours section_' "$LOG" | tail -3 >>"$SUMMARY"
		;;
	vaecheck)
		# the VAE's convs alone (issue 18): the conv op tests (16-bit activations, the cuda
		# backend's channels-last slabs), then every VAE case in f32 and fp16 with each vendor
		# tier forced, and through the worker at its default dtype
		gotest "conv op tests" internal/runtime runtime.test 300 -test.run 'Conv3d|HalfActivations|Pad|Upsample|GroupNorm' -test.v
		grep -E "^(--- FAIL|FAIL|ok|PASS)" "$LOG" | tail -3 >>"$SUMMARY"
		for tier in vendor_tuned vendor_default; do
			FRAMEPACK_CONV_TIER=$tier gotest "parity vae, conv tier $tier forced" workers/vae/causalvae causalvae.test 300 \
				-test.run '^TestParityVAE(Half)?$' -test.v
		done
		(use_workers
			gotest "parity vae worker (default: fp16)" workers/vae vae.test 300 -test.run '^TestParityVAE$' -test.v)
		;;
	vaebench)
		# the VAE stages: channels-last 16-bit convs (the default), the tiled stages again with
		# NCDHW convs and with cuDNN's heuristic choice (no Find), PyTorch's in the same call
		[ -d third_party_ref ] || tar -xJf "$BUNDLE/third_party_ref.tar.xz"
		B=${BENCH_DIR:-/tmp/fpk-bench}
		mkdir -p "$B"
		export PYTHONUNBUFFERED=1
		VS=${VAE_STAGES:-vae_decode,vae_decode_tiled,vae_decode_tiled256,vae_encode}
		run "bench manifests" 300 python3 scripts/gpubench/torch_bench.py --out "$B" --manifests-only
		if [ "${VAE_BASE:-1}" = 1 ]; then # VAE_BASE=0: only the variants
			run "bench ours (channels-last)" 400 "$BIN/gpubench" -dir "$B" -stages "$VS"
			cp "$B"/ours.json "$OUT"/ours.json
			run "bench pytorch" 400 python3 scripts/gpubench/torch_bench.py --out "$B" --stages "${VS//,vae_decode_tiled256/}"
			cp "$B"/torch.json "$OUT"/
			python3 scripts/gpubench/table.py "$B" "$OUT/bench.json" "${BENCH_COMMIT:-}" | tee "$OUT/table.md" >>"$SUMMARY"
		fi
		for v in ${VAE_VARIANTS:-ncdhw heuristic}; do
			case $v in
			ncdhw) FRAMEPACK_CUDNN_LAYOUT=ncdhw run "bench ours ($v)" 300 "$BIN/gpubench" -dir "$B" -stages vae_decode_tiled256 ;;
			heuristic) FRAMEPACK_CONV_TIER=vendor_default run "bench ours ($v)" 300 "$BIN/gpubench" -dir "$B" -stages vae_decode,vae_decode_tiled,vae_decode_tiled256 ;;
			# the own conv tier alone (a driver without vendor convs): its matrix-core kernel,
			# and its FMA kernel on the encode only (minutes on a decode)
			own) FRAMEPACK_CONV_TIER=own_kernel run "bench ours ($v)" 300 "$BIN/gpubench" -dir "$B" -stages vae_decode,vae_decode_tiled,vae_encode ;;
			own8) FRAMEPACK_CONV_TIER=own_kernel FRAMEPACK_GPU_CONV_MMA_WARPS=8 run "bench ours ($v)" 300 "$BIN/gpubench" -dir "$B" -stages vae_decode,vae_decode_tiled,vae_encode ;;
			ownfma) FRAMEPACK_CONV_TIER=own_kernel FRAMEPACK_GPU_CONV_FMA=1 run "bench ours ($v)" 300 "$BIN/gpubench" -dir "$B" -stages vae_encode ;;
			esac
			cp "$B"/ours.json "$OUT/ours-$v.json"
		done
		;;
	vaehalf)
		# the VAE's 16-bit error on every fixture case: ours in fp16 and bf16 (in process), and
		# the reference code (diffusers) in the same dtypes on this GPU, against the same
		# fixture outputs (issue 18's 2e-2 bar). The bf16 parity run fails that bar (as the
		# reference does), so this phase's status is that of the fp16 run and the reference.
		[ -d third_party_ref ] || tar -xJf "$BUNDLE/third_party_ref.tar.xz"
		for dt in fp16 bf16; do
			from=$(($(wc -l <"$LOG") + 1)) # this run's lines of the log only
			keep=$status
			FRAMEPACK_ACTIVATION_DTYPE=$dt gotest "parity vae ($dt, ours)" workers/vae/causalvae causalvae.test 300 \
				-test.run '^TestParityVAEHalf$' -test.v
			[ $dt = bf16 ] && status=$keep
			tail -n +"$from" "$LOG" | grep -E 'rel_l2=' | sed "s/^ */ours $dt: /" >>"$OUT/vaehalf.txt"
		done
		from=$(($(wc -l <"$LOG") + 1))
		run "parity vae (fp16, bf16: the reference code)" 300 python3 scripts/gpubench/vae_half_ref.py --out "$OUT/vaehalf-ref.json"
		tail -n +"$from" "$LOG" | grep -E '^reference' >>"$OUT/vaehalf.txt"
		;;
	vaeprofile)
		B=${BENCH_DIR:-/tmp/fpk-bench}
		for st in ${VAE_PROFILE_STAGES:-vae_decode_tiled}; do
			run "bench profile ($st)" 300 "$BIN/gpubench" -dir "$B" -stages "$st" -profile
			cp "$B/profile-$st.json" "$OUT"/ 2>/dev/null
			sed -n "/^profile $st /,/^\$/p" "$LOG" | head -40 >>"$SUMMARY"
		done
		;;
	fp8)
		use_workers
		gotest "fp8 ops" internal/runtime runtime.test 300 -test.run 'FP8|LinearQ' -test.v -fp8.require-mma
		# which cuBLASLt fp8 calls served: cuBLASLt's own trace (its CUBLASLT_LOG_* variables) of
		# TestLinearQ and one pass of BenchmarkLinearFP8, summarized by D's layout, scale modes and
		# epilogue: the direct path writes D in the activations' type (R_16BF at the bench's
		# 12288 x 17226) with OUTER_VEC scales; its fallback writes R_32F chunks with unit scales
		rm -f "$OUT/cublaslt-fp8.log"
		CUBLASLT_LOG_LEVEL=2 CUBLASLT_LOG_MASK=3 CUBLASLT_LOG_FILE="$OUT/cublaslt-fp8.log" gotest "fp8 cuBLASLt trace" \
			internal/runtime runtime.test 300 -test.run 'TestLinearQ$' -test.bench 'LinearFP8' -test.benchtime 1x -test.v
		lt_fp8_summary "$OUT/cublaslt-fp8.log" | tee -a "$SUMMARY" >>"$LOG"
		if [ -d third_party_ref ] && python3 -c 'import torch, safetensors' 2>/dev/null; then
			run "fp8 reference (gen_fp8.py)" 590 python3 testdata/reference/gen_fp8.py --third-party third_party_ref
			mkdir -p "$OUT/fp8_reference" && cp testdata/reference/cases/fp8_reference.* "$OUT/fp8_reference/" 2>/dev/null
		fi
		for act in f32 bf16; do
			for mode in weight_only tensor token; do
				FRAMEPACK_ACTIVATION_DTYPE=$act gotest "fp8 fixture ($act activations, $mode)" workers/transformer transformer.test 600 \
					-test.run 'TestParityFP8Weights' -test.v -fp8.compute=$mode
			done
			FRAMEPACK_ACTIVATION_DTYPE=$act gotest "fp8 quantize at load, lora, e5m2 block-wise, reference ($act)" workers/transformer \
				transformer.test 600 -test.run 'TestWorkerQuantizeAtLoad|TestWorkerFP8|TestParityFP8Reference' -test.v
		done
		gotest "fp8 footprint" workers/transformer/dit dit.test 120 -test.run 'TestFootprintFP8' -test.v
		gotest "fp8 linear bench" internal/runtime runtime.test 600 -test.run '^$' -test.bench 'LinearFP8' -test.benchtime 20x -test.v
		grep -E "^Benchmark|fp8 stats|no fp8 x fp8 path" "$LOG" | sed 's/^ *//' | tail -30 >>"$SUMMARY"
		;;
	*)
		echo "gpu-check: unknown phase $phase" >&2
		exit 2
		;;
	esac
done
grep -E "rel_l2|mismatches=|max diff" "$LOG" | sed 's/^ *//' | sort -u >"$OUT/parity.txt"
echo "--- summary ($OUT)"
cat "$SUMMARY"
exit $status
