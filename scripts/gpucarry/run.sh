#!/usr/bin/env bash
# run.sh — gpu-check from a carried folder, for device machines that receive another checkout
# (the lead's) whose tracked tree leaves a few MiB for carried files. The folder (an ignored path
# there, e.g. build/gpu16) holds this branch's native/ and scripts, tests.tar.xz (solid xz of the
# test binaries the phases run), optionally bench.tar.xz and third_party_ref.tar.xz; OpenBLAS is
# replaced by blas_stub.c built here (only cpu-backend paths call it).
#   build/gpu16/scripts/gpucarry/run.sh PHASE...   (from the repository root on the device)
set -u
ROOT=$PWD
C=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf native && cp -r "$C/native" native
mkdir -p scripts/gpubench scripts/gpucarry build/gpu /tmp/fpk-gpu-bin/lib
cp "$C/scripts/gpu-check.sh" scripts/
cp "$C"/scripts/gpubench/* scripts/gpubench/
cp "$C"/scripts/gpucarry/* scripts/gpucarry/
for f in tests.tar.xz bench.tar.xz third_party_ref.tar.xz; do
	[ -e "$C/$f" ] && cp "$C/$f" build/gpu/
done
cc -O2 -shared -fPIC -o /tmp/fpk-gpu-bin/lib/libopenblas.so.0 scripts/gpucarry/blas_stub.c || exit 1
cd "$ROOT" && OUT=${OUT:-$ROOT/build/gpu-check} CUDA_ARCHS=${CUDA_ARCHS:-90} scripts/gpu-check.sh "$@"
