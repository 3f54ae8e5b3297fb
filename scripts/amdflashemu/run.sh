#!/bin/sh
# Host emulation of the AMD matrix-core flash kernels (see emu.cpp): extracts their device code
# from native/gpu/fpk_gpu_attention.cu, builds it with clang++ and runs the cases. No GPU needed.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${TMPDIR:-/tmp}/amdflashemu.$$
mkdir -p "$out"
trap 'rm -rf "$out"' EXIT
src="$root/native/gpu/fpk_gpu_attention.cu"
# from the vector typedefs of the matrix paths to the end of flash_amd_body
awk '/^#if defined\(FPK_AMD_MFMA\) \|\| defined\(FPK_AMD_WMMA\)$/ && !on {on=1} /^\/\* The matrix kernel of PATH/ {on=0} on' "$src" >"$out/kernel.inc"
grep -q 'flash_amd_body' "$out/kernel.inc" || { echo "amdflashemu: kernel text not found in $src"; exit 1; }
# the kernels' argument block, as the library declares it
awk '/^struct flash_args \{$/ {on=1} on {print} on && /^\};$/ {exit}' "$src" >"$out/flash_args.inc"
grep -q 'scale_log2' "$out/flash_args.inc" || { echo "amdflashemu: struct flash_args not found in $src"; exit 1; }
cp "$here/emu.cpp" "$out/"
${CXX:-clang++-15} -std=c++20 -O2 -pthread -Wall -Wno-unused-function -Wno-psabi -o "$out/emu" "$out/emu.cpp"
"$out/emu"
