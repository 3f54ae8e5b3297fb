#!/bin/sh
# Host emulation of the fp8 × fp8 MFMA kernel (see emu.cpp): extracts its device code from
# native/gpu/fpk_gpu_gemm_q_mma.cu, builds it with clang++ against an emulated 16x16x32 fp8 MFMA
# and runs the cases. No GPU needed.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${TMPDIR:-/tmp}/fp8mmaemu.$$
mkdir -p "$out"
trap 'rm -rf "$out"' EXIT
src=${FP8MMAEMU_SRC:-"$root/native/gpu/fpk_gpu_gemm_q_mma.cu"} # another copy: to plant bugs
awk '/^\/\* ---- the fp8 kernel body/ {on=1} /^\/\* ---- end of the fp8 kernel body/ {on=0} on' "$src" >"$out/kernel.inc"
grep -q 'fp8mma_wave' "$out/kernel.inc" || { echo "fp8mmaemu: kernel text not found in $src"; exit 1; }
cp "$here/emu.cpp" "$out/"
${CXX:-clang++-15} -std=c++20 -I"$root/native/src" -O2 -pthread -Wall -Wno-unused-function -o "$out/emu" "$out/emu.cpp"
"$out/emu"
