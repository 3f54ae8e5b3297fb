#!/usr/bin/env bash
# bundle.sh — builds here (with Go) what scripts/gpufaults/gpu-faults.sh runs on the GPU machine:
# supervisor/watchdog's test binary (TestGPUFaults), the five workers and mkmodels, stripped, with
# gpu-faults.sh, in one xz stream split into parts of $PART_BYTES (default 3.5 MB) so that each
# fits beside the tracked tree in one call's carry:
#
#   build/faults/1/{part.00,gpu-faults.sh,SHA256SUMS}, build/faults/2/{part.01,…}, …
#
# The workers and the test binary must come from one commit (the worker protocol carries the
# injected faults), so they are built together here.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=build/faults
PART=${PART_BYTES:-3500000}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mkdir -p "$T/pkg/bin"
flags=(-trimpath -ldflags='-s -w')
go test -c "${flags[@]}" -o "$T/pkg/watchdog.test" ./supervisor/watchdog
for p in workers/textenc workers/vae workers/clipvision workers/transformer workers/probe scripts/gpue2e/mkmodels; do
	go build "${flags[@]}" -o "$T/pkg/bin/$(basename "$p")" "./$p"
done
cp scripts/gpufaults/gpu-faults.sh "$T/pkg/"
tar -C "$T" -cf - pkg | xz -T1 --lzma2=preset=9e,dict=256MiB >"$T/bundle.tar.xz"
rm -rf "$B"
split -b "$PART" -d -a 2 "$T/bundle.tar.xz" "$T/part."
(cd "$T" && sha256sum part.*) >"$T/SHA256SUMS"
n=0
for p in "$T"/part.*; do
	n=$((n + 1))
	mkdir -p "$B/$n"
	cp "$p" scripts/gpufaults/gpu-faults.sh "$T/SHA256SUMS" "$B/$n/"
done
du -sh "$T/bundle.tar.xz" "$B"
echo "bundle: $n parts; carry build/faults/1 … build/faults/$n, one a call: bash build/faults/N/gpu-faults.sh stage"
