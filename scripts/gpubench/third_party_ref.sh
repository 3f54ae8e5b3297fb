#!/usr/bin/env bash
# third_party_ref.sh — packs the reference sources the GPU machine's PyTorch side imports
# (scripts/gpubench/torch_bench.py, scripts/gpue2e/framepack_e2e.py) into OUT (default
# build/ref/third_party_ref.tar.xz), from git clones of diffusers and FramePack:
#
#   scripts/gpubench/third_party_ref.sh DIFFUSERS_GIT FRAMEPACK_GIT [OUT]
#
# third_party_ref/diffusers is diffusers' src/diffusers less the pipelines' subfolders (they are
# most of its size and carries are small) except hunyuan_video, which FramePack's
# diffusers_helper imports; third_party_ref/diffusers_helper is FramePack's. Never committed
# (/third_party_ref/ is git-ignored): the sources are read, not vendored.
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,11p' "$0"; exit 2; }
DIFFUSERS=$1 FRAMEPACK=$2
OUT=${3:-build/ref/third_party_ref.tar.xz}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mkdir -p "$T/third_party_ref"
git -C "$DIFFUSERS" archive HEAD src/diffusers | tar -C "$T" -xf -
mv "$T/src/diffusers" "$T/third_party_ref/"
find "$T/third_party_ref/diffusers/pipelines" -mindepth 1 -maxdepth 1 -type d ! -name hunyuan_video -exec rm -rf {} +
git -C "$FRAMEPACK" archive HEAD diffusers_helper | tar -C "$T/third_party_ref" -xf -
mkdir -p "$(dirname "$OUT")"
tar -C "$T" -cJf "$OUT" third_party_ref
echo "$OUT: diffusers $(git -C "$DIFFUSERS" rev-parse --short HEAD), FramePack $(git -C "$FRAMEPACK" rev-parse --short HEAD), $(du -h "$OUT" | cut -f1)"
