#!/usr/bin/env bash
# vendor_attn.sh — one device run for the attention chain's vendor tier (cuDNN 9's fused SDPA),
# from a carried folder (an ignored path of the checkout the device receives, e.g. build/sdpa)
# holding this branch's native/, scripts/gpubench/{vendor_attn.sh,attn_bench.py},
# scripts/gpucarry/blas_stub.c and runtime.test.xz (go test -c -trimpath -ldflags='-s -w'
# ./internal/runtime, xz -9):
#   build/sdpa/scripts/gpubench/vendor_attn.sh     (from the repository root on the device)
# Steps: our enum values against the wheel's cudnn_graph.h; make native-cuda (sm_90); the runtime
# attention tests on cuda with FRAMEPACK_TEST_VENDOR_ATTENTION=1 (cuDNN's refusals logged to
# /tmp/cudnn.log); BenchmarkAttentionDiT vendor and flash; PyTorch SDPA at the same shape. Logs
# under $OUT; a short table last.
set -u
ROOT=$PWD
C=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/build/vendor-attn}
mkdir -p "$OUT"
rm -rf native && cp -r "$C/native" native
NV=$(python3 -c 'import nvidia, os; print(list(nvidia.__path__)[0])' 2>/dev/null)
LIBS=
for d in "$NV"/*/lib; do LIBS="$LIBS:$d"; done
INC=$(dirname "$(find "$NV" -name cudnn_graph.h | head -1)")
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c 'import torch; print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version())' | tee -a "$OUT/gpu.txt"

hdr=skipped
if [ -n "$INC" ]; then
	if nvcc -std=c++17 -DFPK_CUDNN_HEADER_CHECK -I"$INC" -Inative/include -Inative/src -Inative/gpu \
		-c native/gpu/fpk_gpu_vendor_sdpa.cu -o /tmp/hdrcheck.o >/tmp/hdrcheck.log 2>&1; then hdr=same
	else hdr=DIFFERENT; fi
fi
echo "enum values vs $INC/cudnn_graph.h: $hdr" | tee -a "$OUT/gpu.txt"
tail -5 /tmp/hdrcheck.log

t0=$SECONDS
make -j16 native-cuda CUDA_ARCHS=90 >/tmp/build.log 2>&1
build=$?
echo "build rc $build ($((SECONDS - t0)) s)"
tail -3 /tmp/build.log
[ $build -eq 0 ] || exit 1

B=/tmp/fpk-sdpa-bin
mkdir -p "$B/lib"
cc -O2 -shared -fPIC -o "$B/lib/libopenblas.so.0" "$C/scripts/gpucarry/blas_stub.c" || exit 1
xz -dc "$C/runtime.test.xz" >"$B/runtime.test" && chmod +x "$B/runtime.test"
export LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}$LIBS"
export FRAMEPACK_NATIVE_DIR=$ROOT/build/native FRAMEPACK_BACKEND=cuda FRAMEPACK_TEST_VENDOR_ATTENTION=1
export CUDNN_LOGERR_DBG=1 CUDNN_LOGDEST_DBG=/tmp/cudnn.log

cd "$ROOT/internal/runtime" || exit 1
t0=$SECONDS
timeout "${TEST_LIMIT:-150}" "$B/runtime.test" -test.run 'TestAttention' -test.v >"$OUT/tests.log" 2>&1
tests=$?
echo "tests rc $tests ($((SECONDS - t0)) s)"
grep -E "^(--- |FAIL|ok|PASS)|vendor|Fatal" "$OUT/tests.log" | grep -v -- "--- PASS: TestAttention[A-Za-z]*/" | sort | uniq -c | sort -rn | head -40

t0=$SECONDS
timeout "${BENCH_LIMIT:-90}" "$B/runtime.test" -test.run '^$' -test.bench 'AttentionDiT/(vendor|flash)$' -test.benchtime 10x \
	>"$OUT/bench.log" 2>&1
echo "bench rc $? ($((SECONDS - t0)) s)"
cd "$ROOT" || exit 1
timeout 90 python3 "$C/scripts/gpubench/attn_bench.py" >"$OUT/sdpa.log" 2>&1
echo "pytorch rc $?"
head -c 3000 /tmp/cudnn.log 2>/dev/null
# FORWARD=1: the whole transformer forward at full size (random weights; gpubench's transformer
# stage, in the default 16-bit activations as gpu-check's bench phase) with the chain (vendor first),
# PyTorch's forward, then ours with FRAMEPACK_ATTENTION_TIER=flash, each while time is left
# (needs gpubench.xz in the carried folder and build/ref/third_party_ref.tar.xz).
if [ "${FORWARD:-0}" = 1 ]; then
	unset CUDNN_LOGERR_DBG CUDNN_LOGDEST_DBG
	FB=/tmp/fpk-sdpa-bench
	mkdir -p "$FB"
	[ -d third_party_ref ] || tar -xJf build/ref/third_party_ref.tar.xz
	xz -dc "$C/gpubench.xz" >"$B/gpubench" && chmod +x "$B/gpubench"
	export PYTHONUNBUFFERED=1
	t0=$SECONDS
	timeout 60 python3 scripts/gpubench/torch_bench.py --out "$FB" --manifests-only >"$OUT/forward.log" 2>&1
	echo "manifests rc $? ($((SECONDS - t0)) s)"
	left() { echo $((${FORWARD_BUDGET:-200} - SECONDS)); }
	if [ "$(left)" -gt 40 ]; then
		timeout "$(left)" "$B/gpubench" -dir "$FB" -stages transformer >>"$OUT/forward.log" 2>&1
		echo "ours (chain) rc $? ($((SECONDS - t0)) s)"
		cp "$FB/ours.json" "$OUT/ours_vendor.json" 2>/dev/null
	fi
	if [ "$(left)" -gt 40 ]; then
		timeout "$(left)" python3 scripts/gpubench/torch_bench.py --out "$FB" --stages transformer >>"$OUT/forward.log" 2>&1
		echo "pytorch rc $? ($((SECONDS - t0)) s)"
	fi
	if [ "$(left)" -gt 30 ]; then
		FRAMEPACK_ATTENTION_TIER=flash timeout "$(left)" "$B/gpubench" -dir "$FB" -stages transformer >>"$OUT/forward.log" 2>&1
		echo "ours (flash) rc $? ($((SECONDS - t0)) s)"
		cp "$FB/ours.json" "$OUT/ours_flash.json" 2>/dev/null
	fi
	cp "$FB/torch.json" "$OUT/torch.json" 2>/dev/null
	tail -5 "$OUT/forward.log"
fi
echo "--- table"
cat "$OUT/gpu.txt"
grep -E "^Benchmark|skip|SKIP" "$OUT/bench.log"
cat "$OUT/sdpa.log" | tail -2
grep -E "rel L2|first call" "$OUT/tests.log" | grep -E "vendor" | sed 's/^ *//' | sort | uniq -c | sort -rn | head -12
for f in "$OUT"/ours_vendor.json "$OUT"/ours_flash.json "$OUT"/torch.json; do
	[ -e "$f" ] && echo "$(basename "$f"): $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); t=d["stages"]["transformer"]; print(t.get("seconds"), t.get("runs"), t.get("peak_bytes"), t.get("error", ""))' "$f" 2>&1)"
done
