#!/usr/bin/env bash
# gpu-e2e.sh — the end-to-end memory benchmark on the GPU machine (issue 17; no Go there).
# scripts/gpue2e/bundle.sh (here, with Go) packs what it needs; scripts/gpue2e/README.md says how
# to get it there through the device's 64 MiB carry limit and 10-minute calls.
#
#   gpu-e2e.sh PHASE...   from the repository root (the tracked tree) on the GPU machine
#
# stage      (from a carried part folder build/e2e/N/) add this part to $D/parts; once every part
#            of the bundle is there (SHA256SUMS), unpack the binaries, FramePack's driver, the
#            reference sources and this script into $D
# build      libfpk-cuda.so from the tracked native/ (scripts/gpu-check.sh build) unless built
# models     full-size manifests (scripts/gpubench/torch_bench.py --manifests-only), then mkmodels
#            writes the random checkpoints (hub layout, ~43 GB) into $D/models (kept if current)
# ours       the job through framepackd + `framepack generate` at each of $BUDGETS (default
#            cold,all,24,16,8,6; cold: all resident with empty conv caches, a fresh daemon's first
#            job; every other budget starts with the conv decisions and cuDNN Find results the
#            jobs before it left, as a long-lived daemon's next job does), resumable: budgets
#            already in $D/out are kept, and no budget starts that would pass $E2E_LIMIT
#            (default 8m) of this call; the daemons of $TWICE (default 8,6: caps whose VAE
#            tiles no earlier budget has) run the job once before the measured one
# framepack  FramePack's demo_gradio.py loop: high-VRAM, then low-VRAM (DynamicSwap,
#            preservation 6) under a blocker leaving each of $FP_BUDGETS GiB (default 6; "24 16 8 6"
#            is the issue's table); each run kept once done
# report     merge into $D/out/<date>-<gpu>-e2e.json (docs/bench/) and table.md
# all        build models ours framepack report (what `make gpu-e2e` runs)
#
# Every phase copies the results ($D/out/*.json, table.md, logs) to $OUT when set. Results of an
# earlier machine carried back under build/e2e/results/ are seeded into $D/out first.
# Knobs: D (default /tmp/fpk-e2e), BUDGETS, STEPS (25), E2E_LIMIT, FP_MODES ("high low"),
# FP_BUDGETS, CUDA_ARCHS (90). A dry run of the phases on a machine without a GPU (checks this
# script, not the GPU): LANE=cpu DEVICE_GIB=2 TINY=1 BUDGETS=all,0.25 gpu-e2e.sh models ours report
# (tiny models from the fixtures, a 96x64 job).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$PWD
D=${D:-/tmp/fpk-e2e}
LANE=${LANE:-cuda:0}
cpu_lane() { [ "${LANE%%:*}" = cpu ]; }
mkdir -p "$D/parts" "$D/out" "$D/lib"
status=0
say() { echo "gpu-e2e: $*"; }

publish() {
	[ -n "${OUT:-}" ] || return 0
	mkdir -p "$OUT"
	cp "$D"/out/*.json "$D"/out/*.md "$OUT"/ 2>/dev/null
	for f in "$D"/out/*.log; do [ -e "$f" ] && tail -c 200000 "$f" >"$OUT/$(basename "$f")"; done
	return 0
}

env_setup() {
	# the workers link OpenBLAS, which only their cpu paths call: a stub on the GPU machine
	cpu_lane || [ -e "$D/lib/libopenblas.so.0" ] || cc -O2 -shared -fPIC -o "$D/lib/libopenblas.so.0" "$ROOT/scripts/gpucarry/blas_stub.c" || return 1
	export LD_LIBRARY_PATH="$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
	if NV=$(python3 -c 'import nvidia, os; print(list(nvidia.__path__)[0])' 2>/dev/null); then
		for d in $(find "$NV" -name 'libcudnn.so.9' -o -name 'libcublas.so.1[23]' -o -name 'libnvrtc.so*' 2>/dev/null | xargs -r -n1 dirname | sort -u); do
			LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
		done
	fi
	export FRAMEPACK_NATIVE_DIR=$ROOT/build/native
	[ -d "$ROOT/third_party_ref" ] || tar -C "$ROOT" -xJf "$D/pkg/third_party_ref.tar.xz"
	# results an earlier machine produced, carried back
	for f in "$ROOT"/build/e2e/results/*.json; do
		[ -e "$f" ] && [ ! -e "$D/out/$(basename "$f")" ] && cp "$f" "$D/out/"
	done
	return 0
}

need_bundle() {
	[ -x "$D/pkg/bin/e2e" ] || { say "the bundle is not staged in $D: carry build/e2e/N and run its gpu-e2e.sh stage first"; exit 2; }
}

phases=("$@")
[ ${#phases[@]} -eq 0 ] && phases=(all)
[ "${phases[0]}" = all ] && phases=(build models ours framepack report)
for phase in "${phases[@]}"; do
	t0=$SECONDS
	case $phase in
	stage)
		cp "$HERE"/part.* "$D/parts/" && cp "$HERE/SHA256SUMS" "$D/parts/"
		if (cd "$D/parts" && sha256sum --quiet -c SHA256SUMS >/dev/null 2>&1); then
			rm -rf "$D/pkg" && cat "$D"/parts/part.* | xz -dc | tar -C "$D" -xf - && cp "$D/pkg/gpu-e2e.sh" "$D/gpu-e2e.sh" &&
				say "staged: every part is here; unpacked into $D/pkg" || status=1
		else
			say "part $(basename "$HERE") stored; $(ls "$D"/parts/part.* | wc -l) of $(wc -l <"$D/parts/SHA256SUMS") parts here"
		fi
		;;
	build)
		need_bundle
		if cpu_lane; then say "cpu lane: nothing to build"; elif [ -e "$ROOT/build/native/libfpk-cuda.so" ]; then say "libfpk-cuda.so kept"; else
			OUT="$D/out/gpucheck" CUDA_ARCHS=${CUDA_ARCHS:-90} bash "$ROOT/scripts/gpu-check.sh" build >"$D/out/build.log" 2>&1 || status=1
			tail -3 "$D/out/build.log"
		fi
		;;
	models)
		need_bundle
		env_setup || status=1
		man=(-manifests "$D/manifests")
		if [ -n "${TINY:-}" ]; then man=(-shard-mb 2); else
			python3 "$ROOT/scripts/gpubench/torch_bench.py" --out "$D/manifests" --manifests-only >"$D/out/manifests.log" 2>&1 || { status=1; tail -5 "$D/out/manifests.log"; }
		fi
		"$D/pkg/bin/mkmodels" -fixtures "$ROOT/testdata/parity/models" "${man[@]}" -out "$D/models" | tee "$D/out/mkmodels.log" || status=1
		df -h "$D" | tail -1
		;;
	ours)
		need_bundle
		env_setup || status=1
		job=(-steps "${STEPS:-25}")
		[ -n "${TINY:-}" ] && job=(-width 96 -height 64 -resolution 96 -window 3 -steps 2 -seconds 0.5)
		[ -n "${DEVICE_GIB:-}" ] && job+=(-device-gib "$DEVICE_GIB")
		"$D/pkg/bin/e2e" -bin "$D/pkg/bin" -models "$D/models" -out "$D/out" -lane "$LANE" -budgets "${BUDGETS:-cold,all,24,16,8,6}" -twice "${TWICE-8,6}" \
			"${job[@]}" -limit "${E2E_LIMIT:-8m}" 2>&1 | tee -a "$D/out/ours.log"
		[ "${PIPESTATUS[0]}" = 0 ] || status=1
		;;
	framepack)
		need_bundle
		env_setup || status=1
		runs=()
		for m in ${FP_MODES:-high low}; do
			if [ "$m" = low ]; then for b in ${FP_BUDGETS:-6}; do runs+=("low $b"); done; else runs+=("high 0"); fi
		done
		for r in "${runs[@]}"; do
			set -- $r
			timeout 580 python3 "$D/pkg/framepack_e2e.py" --third-party "$ROOT/third_party_ref" --models "$D/models" \
				--out "$D/out/framepack.json" --mode "$1" --budget "$2" --steps "${STEPS:-25}" --skip-done >>"$D/out/framepack.log" 2>&1 || status=1
			grep -E '^framepack' "$D/out/framepack.log" | tail -3
		done
		;;
	report)
		need_bundle
		gpu=cpu
		cpu_lane || gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 | head -1)
		short=$(echo "$gpu" | tr 'A-Z' 'a-z' | grep -oE 'h100|h200|a100|l40s|[a-z]?[0-9]{3,4}' | head -1)
		f="$D/out/$(date -u +%F)-${short:-gpu}-e2e.json"
		fp=()
		[ -e "$D/out/framepack.json" ] && fp=(-framepack "$D/out/framepack.json")
		"$D/pkg/bin/e2e" -out "$D/out" -budgets "${BUDGETS:-cold,all,24,16,8,6}" -report "$f" "${fp[@]}" -gpu "$gpu" | tee "$D/out/table.md"
		[ "${PIPESTATUS[0]}" = 0 ] || status=1
		;;
	*)
		say "unknown phase $phase"
		exit 2
		;;
	esac
	say "$phase done in $((SECONDS - t0)) s"
	publish
done
exit $status
