#!/usr/bin/env bash
# gpu-bundle.sh — builds here (with Go) what scripts/gpu-check.sh runs on the GPU machine, which
# has no Go: the test binaries of the packages it checks, the four model workers their tests and
# the pipeline's daemon start (<model>-worker, which gpu-check's stand-in `go build` copies), and
# gpubench (stripped, one solid xz archive: they share most of their code), the OpenBLAS the cgo
# binaries link against, and third_party_ref/, into build/gpu (git-ignored; carried with the
# run).
set -euo pipefail
cd "$(dirname "$0")/.."
B=build/gpu
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
rm -rf "$B"
mkdir -p "$B/lib"
flags=(-trimpath -ldflags='-s -w')
while read -r name pkg; do
	go test -c "${flags[@]}" -o "$T/$name.test" "./$pkg"
done <<'LIST'
runtime internal/runtime
devices internal/devices
causalvae workers/vae/causalvae
textenc workers/textenc
siglip workers/clipvision/siglip
dit workers/transformer/dit
sampler workers/transformer/sampler
transformer workers/transformer
clipvision workers/clipvision
vae workers/vae
pipeline supervisor/pipeline
torchrng internal/torchrng
imageproc internal/imageproc
tokenizer internal/tokenizer
LIST
go build "${flags[@]}" -o "$T/gpubench" ./scripts/gpubench
for w in textenc vae clipvision transformer; do
	go build "${flags[@]}" -o "$T/$w-worker" "./workers/$w"
done
tar -C "$T" -cf - . | xz -T2 -9 >"$B/bins.tar.xz"
for lib in libopenblas.so.0 libgfortran.so.5 libquadmath.so.0; do
	cp -L "$(ldconfig -p | awk -v l="$lib" '$1 == l && /x86-64/ {print $NF; exit}')" "$B/lib/$lib"
done
xz -T2 -6 -f "$B"/lib/*.so.*
# the reference sources the PyTorch side imports (git-ignored, never committed)
[ -d third_party_ref ] && tar -cJf "$B/third_party_ref.tar.xz" third_party_ref
du -sh "$B"
