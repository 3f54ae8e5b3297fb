#!/usr/bin/env bash
# fuse_check.sh — device check of the fused ops (fuse branch, issue 16): builds libfpk-cuda.so from
# the carried native/, runs the new ops' tests, the dit/llama/clip parity on cuda and
# BenchmarkFusedDiT (with and without cuBLASLt). Carried as build/fuse with native.tar.xz,
# tests.tar.xz (runtime, dit, llama, clip test binaries) and scripts/gpucarry/blas_stub.c. Logs under $OUT.
set -u
ROOT=$PWD
C=$ROOT/build/fuse
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
LOG=$OUT/log.txt
S=$OUT/summary.txt
: >"$S"
say() { echo "$*" | tee -a "$S"; }
rm -rf native && tar -xJf "$C/native.tar.xz"
BIN=/tmp/fpk-gpu-bin
mkdir -p $BIN/lib && tar -C $BIN -xJf "$C/tests.tar.xz" && chmod +x $BIN/*.test
cc -O2 -shared -fPIC -o $BIN/lib/libopenblas.so.0 "$C/blas_stub.c" || exit 1
export LD_LIBRARY_PATH="$BIN/lib"
if NV=$(python3 -c 'import nvidia, os; print(list(nvidia.__path__)[0])' 2>/dev/null); then
	for d in $(find "$NV" \( -name 'libcudnn.so.9' -o -name 'libcublas.so.1[23]' -o -name 'libcublasLt.so.1[23]' -o -name 'libnvrtc.so*' \) 2>/dev/null | xargs -r -n1 dirname | sort -u); do
		LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
	done
fi
export FRAMEPACK_NATIVE_DIR=$ROOT/build/native FRAMEPACK_FIXTURES=$ROOT/testdata/parity FRAMEPACK_BACKEND=cuda
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$S"
t0=$SECONDS
make --no-print-directory -j16 native-cuda CUDA_ARCHS=90 GO=true >>"$LOG" 2>&1 && say "PASS build ($((SECONDS - t0)) s)" || { say "FAIL build"; tail -30 "$LOG"; exit 1; }
run() { # name dir limit args... (env before)
	local name=$1 dir=$2 bin=$3 limit=$4; shift 4
	local t=$SECONDS
	echo "=== $name" >>"$LOG"
	(cd "$ROOT/$dir" && timeout "$limit" "$BIN/$bin" -test.count=1 "$@") >>"$LOG" 2>&1
	local rc=$?
	[ $rc -eq 0 ] && say "PASS $name ($((SECONDS - t)) s)" || say "FAIL $name (rc $rc)"
}
export FRAMEPACK_TEST_VENDOR_ATTENTION=1
run "runtime: fused ops, gemm, norms, rope, causal + vendor attention" internal/runtime runtime.test 90 -test.v \
	-test.run '^(TestRMSNormRoPE|TestRMSNormRoPERejectsBadShapes|TestLinearGELU|TestProfileReportsEveryOp|TestAttentionCausal|TestAttentionVendorChain|TestMatMul|TestLinear|TestMatMulHalfWeights|TestLinearHalfWeights|TestRMSNorm|TestRoPE|TestAttentionHalfCompute)$'
unset FRAMEPACK_TEST_VENDOR_ATTENTION
run "parity transformer (cuBLASLt epilogues)" workers/transformer/dit dit.test 60 -test.run '^TestParity' -test.v
FRAMEPACK_GPU_NO_BLASLT=1 run "parity transformer (FRAMEPACK_GPU_NO_BLASLT=1)" workers/transformer/dit dit.test 60 -test.run '^TestParity' -test.v
run "parity llama" workers/textenc/llama llama.test 60 -test.run '^TestParity' -test.v
run "parity clip" workers/textenc/clip clip.test 60 -test.run '^TestParity' -test.v
run "bench fused (half compute)" internal/runtime runtime.test 60 -test.run '^$' -test.bench 'FusedDiT' -test.benchtime 10x
FRAMEPACK_GPU_NO_BLASLT=1 run "bench fused ff without cuBLASLt" internal/runtime runtime.test 40 -test.run '^$' -test.bench 'FusedDiT/.*ff' -test.benchtime 10x
echo "---- failures / rel_l2 / bench"
grep -E "^(--- FAIL|FAIL)|FAIL:|panic" "$LOG" | head -20
grep -E "rel L2|rel_l2" "$LOG" | grep -iE "vendor|sample|causal" | head -12
grep -E "^BenchmarkFusedDiT" "$LOG"
cat "$S"
cp "$LOG" "$OUT/" 2>/dev/null
