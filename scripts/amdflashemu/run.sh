#!/bin/sh
# Host emulation of the AMD matrix-core flash kernels (see emu.cpp): extracts their device code
# from native/gpu/fpk_gpu_attention.cu and the instructions' from fpk_gpu_mma.h, builds it with
# clang++ and runs the cases. No GPU needed.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${TMPDIR:-/tmp}/amdflashemu.$$
mkdir -p "$out"
trap 'rm -rf "$out"' EXIT
src="$root/native/gpu/fpk_gpu_attention.cu"
hdr="$root/native/gpu/fpk_gpu_mma.h"
# the shared AMD operand types and instructions, then from the matrix paths' helpers to the end
# of flash_amd_body
awk '/^\/\* ---- AMD operand types and instructions/ {on=1} /^\/\* ---- end of the AMD block/ {on=0} on' "$hdr" >"$out/kernel.inc"
grep -q 'amd_mfma16' "$out/kernel.inc" || { echo "amdflashemu: the AMD block not found in $hdr"; exit 1; }
awk '/^#if defined\(FPK_AMD_MFMA\) \|\| defined\(FPK_AMD_WMMA\)$/ && !on {on=1} /^\/\* The matrix kernel of PATH/ {on=0} on' "$src" >>"$out/kernel.inc"
grep -q 'flash_amd_body' "$out/kernel.inc" || { echo "amdflashemu: kernel text not found in $src"; exit 1; }
# the kernels' argument block, as the library declares it
awk '/^struct flash_args \{$/ {on=1} on {print} on && /^\};$/ {exit}' "$src" >"$out/flash_args.inc"
grep -q 'scale_log2' "$out/flash_args.inc" || { echo "amdflashemu: struct flash_args not found in $src"; exit 1; }
cp "$here/emu.cpp" "$out/"
${CXX:-clang++-15} -std=c++20 -I"$root/native/src" -O2 -pthread -Wall -Wno-unused-function -Wno-psabi -o "$out/emu" "$out/emu.cpp"
"$out/emu"
