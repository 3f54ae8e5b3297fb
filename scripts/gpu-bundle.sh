#!/usr/bin/env bash
# gpu-bundle.sh — builds here (with Go) what scripts/gpu-check.sh runs on the GPU machine, which
# has no Go, into build/gpu (git-ignored; carried with the run), stripped:
#   tests.tar.xz   the test binaries of the tests and tiers phases and the four model workers
#                  their tests and the pipeline's daemon start (<model>-worker, which
#                  scripts/fakego/go copies for testbin), one solid xz archive (they share most
#                  of their code) with a dictionary that spans it
#   bench.tar.xz   what the memory and bench phases add: devices.test and gpubench
#   lib/           the OpenBLAS the cgo binaries link against
#   third_party_ref.tar.xz  the reference sources the PyTorch side of the bench imports
# A run carries what its phases need: the tree with build/gpu/tests.tar.xz and build/gpu/lib fits
# the device machine's 64 MiB for build, tests and tiers.
set -euo pipefail
cd "$(dirname "$0")/.."
B=build/gpu
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
rm -rf "$B"
mkdir -p "$B/lib"
mkdir -p "$T/tests" "$T/bench"
flags=(-trimpath -ldflags='-s -w')
while read -r dir name pkg; do
	go test -c "${flags[@]}" -o "$T/$dir/$name.test" "./$pkg"
done <<'LIST'
tests runtime internal/runtime
tests causalvae workers/vae/causalvae
tests textenc workers/textenc
tests llama workers/textenc/llama
tests clip workers/textenc/clip
tests siglip workers/clipvision/siglip
tests dit workers/transformer/dit
tests sampler workers/transformer/sampler
tests transformer workers/transformer
tests clipvision workers/clipvision
tests vae workers/vae
tests pipeline supervisor/pipeline
tests torchrng internal/torchrng
tests imageproc internal/imageproc
tests tokenizer internal/tokenizer
bench devices internal/devices
LIST
go build "${flags[@]}" -o "$T/bench/gpubench" ./scripts/gpubench
for w in textenc vae clipvision transformer; do
	go build "${flags[@]}" -o "$T/tests/$w-worker" "./workers/$w"
done
# one xz block with a dictionary over the whole tar: the binaries share code megabytes apart
tar -C "$T/tests" -cf - . | xz -T1 --lzma2=preset=9,dict=256MiB >"$B/tests.tar.xz"
tar -C "$T/bench" -cf - . | xz -T2 -9 >"$B/bench.tar.xz"
for lib in libopenblas.so.0 libgfortran.so.5 libquadmath.so.0; do
	cp -L "$(ldconfig -p | awk -v l="$lib" '$1 == l && /x86-64/ {print $NF; exit}')" "$B/lib/$lib"
done
xz -T2 -9e -f "$B"/lib/*.so.*
# the reference sources the PyTorch side imports (git-ignored, never committed)
[ -d third_party_ref ] && tar -cJf "$B/third_party_ref.tar.xz" third_party_ref
du -sh "$B"
