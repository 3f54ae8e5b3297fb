#!/usr/bin/env bash
# bundle.sh — builds here (with Go) what scripts/gpue2e/gpu-e2e.sh runs on the GPU machine, which
# has no Go: framepackd, the framepack CLI, the five workers, mkmodels and the e2e harness
# (stripped), FramePack's driver, gpu-e2e.sh and the reference sources (diffusers and
# diffusers_helper: $REF, a third_party_ref.tar.xz), in one xz stream split into parts of
# $PART_BYTES (default 3.5 MB) so that each fits beside the tracked tree in one call's carry:
#
#   build/e2e/1/{part.00,gpu-e2e.sh,SHA256SUMS}, build/e2e/2/{part.01,…}, …
#
# Each call carries one folder and runs `bash build/e2e/N/gpu-e2e.sh stage`; the call that brings
# the last part unpacks everything (scripts/gpue2e/README.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
B=build/e2e
PART=${PART_BYTES:-3500000}
REF=${REF:-}
if [ -z "$REF" ]; then
	for c in build/ref/third_party_ref.tar.xz ../../main/build/ref/third_party_ref.tar.xz /work/main/build/ref/third_party_ref.tar.xz; do
		[ -e "$c" ] && REF=$c && break
	done
fi
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mkdir -p "$T/pkg/bin"
flags=(-trimpath -ldflags='-s -w')
for p in cmd/framepackd cmd/framepack workers/textenc workers/vae workers/clipvision workers/transformer workers/probe \
	scripts/gpue2e/mkmodels scripts/gpue2e/e2e; do
	go build "${flags[@]}" -o "$T/pkg/bin/$(basename "$p")" "./$p"
done
cp scripts/gpue2e/gpu-e2e.sh scripts/gpue2e/framepack_e2e.py "$T/pkg/"
if [ -n "$REF" ]; then
	cp "$REF" "$T/pkg/third_party_ref.tar.xz"
elif [ -d third_party_ref ]; then
	tar -cJf "$T/pkg/third_party_ref.tar.xz" third_party_ref
else
	echo "bundle: no reference sources: set REF=path/to/third_party_ref.tar.xz" >&2
	exit 1
fi
# one xz block with a dictionary over the whole tar: the binaries share code megabytes apart
tar -C "$T" -cf - pkg | xz -T1 --lzma2=preset=9e,dict=256MiB >"$T/bundle.tar.xz"
rm -rf "$B"
mkdir -p "$B"
split -b "$PART" -d -a 2 "$T/bundle.tar.xz" "$T/part."
n=0
(cd "$T" && sha256sum part.*) >"$T/SHA256SUMS"
for p in "$T"/part.*; do
	n=$((n + 1))
	mkdir -p "$B/$n"
	cp "$p" scripts/gpue2e/gpu-e2e.sh "$T/SHA256SUMS" "$B/$n/"
done
du -sh "$T/bundle.tar.xz" "$B"
echo "bundle: $n parts; carry build/e2e/1 … build/e2e/$n, one a call: bash build/e2e/N/gpu-e2e.sh stage"
