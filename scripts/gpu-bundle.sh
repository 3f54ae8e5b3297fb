#!/usr/bin/env bash
# gpu-bundle.sh — builds here (with Go) what scripts/gpu-check.sh runs on the GPU machine, which
# has no Go: the test binaries of the packages it checks and gpubench (stripped, xz), and the
# OpenBLAS the cgo binaries link against, into build/gpu (git-ignored; carried with the run).
set -euo pipefail
cd "$(dirname "$0")/.."
B=build/gpu
rm -rf "$B"
mkdir -p "$B/lib"
flags=(-trimpath -ldflags='-s -w')
while read -r name pkg; do
	go test -c "${flags[@]}" -o "$B/$name.test" "./$pkg"
done <<'LIST'
runtime internal/runtime
devices internal/devices
causalvae workers/vae/causalvae
textenc workers/textenc
siglip workers/clipvision/siglip
dit workers/transformer/dit
LIST
go build "${flags[@]}" -o "$B/gpubench" ./scripts/gpubench
for lib in libopenblas.so.0 libgfortran.so.5 libquadmath.so.0; do
	cp -L "$(ldconfig -p | awk -v l="$lib" '$1 == l && /x86-64/ {print $NF; exit}')" "$B/lib/$lib"
done
# the reference sources the PyTorch side imports (git-ignored, never committed)
[ -d third_party_ref ] && tar -cJf "$B/third_party_ref.tar.xz" third_party_ref
xz -T2 -6 -f "$B"/*.test "$B"/gpubench "$B"/lib/*.so.*
du -sh "$B"
