#!/usr/bin/env bash
# bundle.sh — builds here (with Go) what scripts/gpue2e/gpu-e2e.sh runs on the GPU machine, which
# has no Go: framepackd, the framepack CLI, the five workers and the e2e harness (stripped, one
# multicall binary: multicall.sh), mkmodels, FramePack's driver, gpu-e2e.sh and the reference sources (diffusers and
# diffusers_helper: $REF, a third_party_ref.tar.xz), in one xz stream split into parts that each
# fit beside the tracked tree in one call's carry (64 MiB in all):
#
#   build/e2e/1/{part.00,gpu-e2e.sh,SHA256SUMS,EARLY}, build/e2e/2/{part.01,…}, …
#
# The stream begins with what can start before the rest is there (EARLY: this script,
# FramePack's driver, the reference sources, mkmodels), so the GPU machine writes the models
# while the later parts are still being carried. Run it in the checkout the device calls send
# (the lead's): the part size is what that tree leaves of 64 MiB, less MARGIN_BYTES (default
# 192 KiB, for the tree growing before the run); PART_BYTES overrides it. The call sequence is in
# scripts/gpue2e/README.md; the last lines printed here repeat it with this bundle's numbers.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=build/e2e
LIMIT=$((64 << 20))
REF=${REF:-}
if [ -z "$REF" ]; then
	for c in build/ref/third_party_ref.tar.xz ../../main/build/ref/third_party_ref.tar.xz /work/main/build/ref/third_party_ref.tar.xz; do
		[ -e "$c" ] && REF=$c && break
	done
fi
# what every call sends besides the carried part: tracked and untracked-not-ignored files, shared/
tree=$({ git ls-files -z --cached; git ls-files -z --others --exclude-standard; } | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
[ -d shared ] && git check-ignore -q shared && tree=$((tree + $(du -sb shared | cut -f1)))
PART=${PART_BYTES:-$((LIMIT - tree - ${MARGIN_BYTES:-196608} - 32768))}
if [ "$PART" -lt 262144 ]; then
	echo "bundle: the tree sent with every call is $tree bytes: $PART bytes left of 64 MiB for a part (set PART_BYTES to force)" >&2
	exit 1
fi
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mkdir -p "$T/pkg/bin"
# the daemon, the CLI, the five workers and the harness as one binary called by their names
# (multicall.sh: ≈ 6 MB compressed against ≈ 12 for seven binaries); mkmodels alone, early
scripts/gpue2e/multicall.sh "$T/pkg/bin"
go build -trimpath -ldflags='-s -w' -o "$T/pkg/bin/mkmodels" ./scripts/gpue2e/mkmodels
cp scripts/gpue2e/gpu-e2e.sh scripts/gpue2e/framepack_e2e.py "$T/pkg/"
if [ -n "$REF" ]; then
	cp "$REF" "$T/pkg/third_party_ref.tar.xz"
elif [ -d third_party_ref ]; then
	tar -cJf "$T/pkg/third_party_ref.tar.xz" third_party_ref
else
	echo "bundle: no reference sources: set REF=path/to/third_party_ref.tar.xz (scripts/gpubench/third_party_ref.sh makes one)" >&2
	exit 1
fi
early=(pkg/gpu-e2e.sh pkg/framepack_e2e.py pkg/third_party_ref.tar.xz pkg/bin/mkmodels)
(cd "$T" && sha256sum "${early[@]}") >"$T/EARLY"
rest=(pkg/bin/fpk)
for f in "$T"/pkg/bin/*; do
	[ -L "$f" ] && rest+=("pkg/bin/$(basename "$f")")
done
# one xz block with a dictionary over the whole tar (the binaries share code megabytes apart),
# the early members first
tar -C "$T" -cf - "${early[@]}" "${rest[@]}" | xz -T1 --x86 --lzma2=preset=9e,dict=256MiB >"$T/bundle.tar.xz"
rm -rf "$B"/[0-9]* # the parts of an earlier bundle (results/ stays)
mkdir -p "$B"
split -b "$PART" -d -a 2 "$T/bundle.tar.xz" "$T/part."
(cd "$T" && sha256sum part.*) >"$T/SHA256SUMS"
n=0
for p in "$T"/part.*; do
	n=$((n + 1))
	mkdir -p "$B/$n"
	cp "$p" scripts/gpue2e/gpu-e2e.sh "$T/SHA256SUMS" "$T/EARLY" "$B/$n/"
done
# the first part after which the early members are complete
k=0
for i in $(seq 1 "$n"); do
	rm -rf "$T/x" && mkdir "$T/x"
	cat $(for j in $(seq 1 "$i"); do echo "$B/$j"/part.*; done) | xz -dc 2>/dev/null | tar -C "$T/x" -xf - 2>/dev/null || true
	if (cd "$T/x" && sha256sum --quiet -c "$T/EARLY" >/dev/null 2>&1); then
		k=$i
		break
	fi
done
du -sh "$T/bundle.tar.xz" "$B"
cat <<EOF
bundle: $n parts of $PART bytes (the tree sent with each call: $tree bytes); the early members (models can start) after part $k
  call 1:      run carry=["$B/1"] command="STEPS=5 LONG_STEPS=3 bash $B/1/gpu-e2e.sh stage bg build bg models bg framepack+ours+long+report" timeout_s=120
  call 2..$((n - 1)):   run carry=["$B/N"] command="bash $B/N/gpu-e2e.sh stage" timeout_s=120
  call $n:      run carry=["$B/$n"] command="bash $B/$n/gpu-e2e.sh stage wait 500" timeout_s=600
  then, until it exits 0: run command="bash /tmp/fpk-e2e/gpu-e2e.sh wait 540" timeout_s=600
EOF
