#!/bin/sh
# Host emulation of the channels-last conv's matrix kernels (see emu.cpp): extracts their device
# code from native/gpu/fpk_gpu_conv_mma.cu and the AMD instructions' from fpk_gpu_mma.h, builds
# it with clang++ and runs the cases. No GPU needed.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${TMPDIR:-/tmp}/convmmaemu.$$
mkdir -p "$out"
trap 'rm -rf "$out"' EXIT
src=${CONVMMAEMU_SRC:-"$root/native/gpu/fpk_gpu_conv_mma.cu"} # another copy: to plant bugs
hdr="$root/native/gpu/fpk_gpu_mma.h"
awk '/^\/\* ---- AMD operand types and instructions/ {on=1} /^\/\* ---- end of the AMD block/ {on=0} on' "$hdr" >"$out/kernel.inc"
grep -q 'amd_wmma16' "$out/kernel.inc" || { echo "convmmaemu: the AMD block not found in $hdr"; exit 1; }
awk '/^\/\* ---- the kernel body/ {on=1} /^\/\* ---- end of the kernel body/ {on=0} on' "$src" >>"$out/kernel.inc"
grep -q 'convmma_body' "$out/kernel.inc" || { echo "convmmaemu: kernel text not found in $src"; exit 1; }
cp "$here/emu.cpp" "$out/"
${CXX:-clang++-15} -std=c++20 -I"$root/native/src" -O2 -Wall -Wno-unused-function -Wno-psabi -Wno-deprecated-declarations -o "$out/emu" "$out/emu.cpp"
"$out/emu"
