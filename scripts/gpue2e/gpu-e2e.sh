#!/usr/bin/env bash
# gpu-e2e.sh — the end-to-end benchmark on the GPU machine (issues 17 and 30; no Go there).
# scripts/gpue2e/bundle.sh (here, with Go) packs what it needs; scripts/gpue2e/README.md says how
# to get it there through the device's 64 MiB carry limit and 10-minute calls, and the exact
# sequence of calls.
#
#   gpu-e2e.sh PHASE...   from the repository root (the tracked tree) on the GPU machine
#
# stage      (from a carried part folder build/e2e/N/) add this part to $D/parts; as soon as the
#            parts here hold the bundle's first members (this script, FramePack's driver, the
#            reference sources, mkmodels: EARLY), unpack those into $D/early; once every part is
#            here (SHA256SUMS), unpack the whole bundle into $D/pkg
# build      libfpk-cuda.so (scripts/gpu-check.sh build) in $D/src, a copy of the tracked tree
#            taken once (later calls re-send the tree; a build in the background reads its copy)
# models     full-size manifests (scripts/gpubench/torch_bench.py --manifests-only), then mkmodels
#            writes the random checkpoints (hub layout, ~43 GB) into $D/models (kept if current);
#            waits (up to $EARLY_WAIT s) for the early members when started before they are here
# framepack  FramePack's demo_gradio.py loop on the same job: high-VRAM, then low-VRAM (DynamicSwap,
#            preservation 6) under a blocker leaving each of $FP_BUDGETS GiB (default "16 6"); each
#            run kept once done; waits for models (not for build: it may run beside it, and the
#            rows then say so)
# ours       the 4 s job through framepackd + the CLI at each of $BUDGETS (default keep,all,16,6;
#            keep: the daemon runs the job twice with keep-alive on and the second is measured),
#            resumable: budgets already in $D/out are kept; waits for build and models; in the
#            foreground no budget starts that would pass $E2E_LIMIT (default 8m) of this call
# long       the $LONG_SECONDS (60) s job at $LONG_GB (16) GiB with $LONG_STEPS (5) steps
# extra      ours at $EXTRA_BUDGETS (default 24,8): the budgets the goals table does not need
# fp8        ours at $FP8_BUDGETS (default fp8-keep,fp8-16,fp8-6): keep, 16 and 6 with the
#            transformer quantized to fp8 at load (`framepack generate --weights fp8
#            --fp8-compute $FP8_COMPUTE`, default token); the report sets them beside FramePack at
#            the same memory and beside our bf16 budget of the same memory (issue 31)
# report     merge into $D/out/<date>-<gpu>-e2e.json (docs/bench/) and table.md
# all        build models framepack ours long report (what `make gpu-e2e` runs, in the foreground)
#
# Background runs, so that the GPU never waits for the next call and no phase is cut at 10 min:
# bg A+B+…   start phases A, B, … one after the other in a new session (setsid: it outlives the
#            call while the machine stays warm); several bg runs may go side by side (build and
#            models do; the GPU phases go in one run); log $D/out/bg-A+B+….log
# wait [S]   follow the background runs for up to S seconds (default $WAIT_S, 540): their new
#            progress lines, then the results; exit 0 once every run ended well, 3 while one is
#            still running, 1 when one failed
#
# Every call copies the results to $OUT when set: results.tar.gz ($D/out/*.json, table.md, the
# logs' tails), table.md and progress.txt. Results of an earlier machine carried back under
# build/e2e/results/ are seeded into $D/out first.
# Knobs: D (/tmp/fpk-e2e), BUDGETS, STEPS (25; the same steps on both sides), JOB_SECONDS (4),
# LONG_SECONDS, LONG_GB, LONG_STEPS, EXTRA_BUDGETS, FP8_BUDGETS, FP8_COMPUTE (token; weight_only,
# tensor), E2E_LIMIT, FP_MODES ("high low"), FP_BUDGETS, FP_TIMEOUT (900), FP_WRITE_VIDEO (1:
# FramePack writes its MP4s as demo_gradio.py does), WAIT_S, CUDA_ARCHS (90). A dry run of the
# phases on a machine without a GPU (checks this script, not the GPU): LANE=cpu DEVICE_GIB=3 TINY=1
# BUDGETS=keep,all,0.25 FP8_BUDGETS=fp8-all,fp8-0.25 gpu-e2e.sh models ours fp8 long report (tiny
# models from the fixtures, a 96x64 job; long: 2 s at 1 GiB, 1 step).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$PWD
D=${D:-/tmp/fpk-e2e}
LANE=${LANE:-cuda:0}
cpu_lane() { [ "${LANE%%:*}" = cpu ]; }
mkdir -p "$D/parts" "$D/out" "$D/lib" "$D/bg"
# Knobs given to an earlier call (the one that started the conductor) hold for the later ones
# (a later `bg extra+report` runs at the same steps); a knob given again wins.
KNOBS="STEPS JOB_SECONDS LONG_SECONDS LONG_GB LONG_STEPS LONG_TIMEOUT BUDGETS EXTRA_BUDGETS FP8_BUDGETS FP8_COMPUTE TWICE FP_MODES FP_BUDGETS FP_TIMEOUT FP_WRITE_VIDEO"
# shellcheck disable=SC1091
[ -e "$D/knobs" ] && . "$D/knobs"
for k in $KNOBS; do
	if [ -n "${!k+x}" ]; then printf ': "${%s:=%s}"; export %s\n' "$k" "${!k}" "$k"; fi
done >"$D/knobs.$$" && mv "$D/knobs.$$" "$D/knobs"
STEPS=${STEPS:-25}
status=0
say() { echo "gpu-e2e: $(date -u +%T) $*"; }
SRC=$D/src
if cpu_lane; then SRC=$ROOT; fi # a dry run builds nothing and reads the tree in place

publish() {
	[ -n "${OUT:-}" ] || return 0
	mkdir -p "$OUT" "$D/pub"
	rm -rf "$D/pub"/*
	cp "$D"/out/*.json "$D"/out/*.md "$D/pub/" 2>/dev/null
	for f in "$D"/out/*.log "$D"/out/gpucheck/*.txt; do [ -e "$f" ] && tail -c 300000 "$f" >"$D/pub/$(basename "$f")"; done
	tar -C "$D/pub" -czf "$OUT/results.tar.gz" . 2>/dev/null
	[ -e "$D/out/table.md" ] && cp "$D/out/table.md" "$OUT/"
	progress >"$OUT/progress.txt"
	return 0
}

# progress: what every background run is doing, and the results so far.
progress() {
	for p in "$D"/bg/*.pid; do
		[ -e "$p" ] || continue
		n=$(basename "$p" .pid)
		if [ -e "$D/bg/$n.rc" ]; then echo "bg $n: ended, exit $(cat "$D/bg/$n.rc")"; else echo "bg $n: running since $(date -u -r "$p" +%T)"; fi
	done
	ls "$D"/out/budget-*.json 2>/dev/null | sed 's|.*/|done: |'
	[ -e "$D/out/framepack.json" ] && echo "framepack: $(grep -c '"stage": "job"' "$D/out/framepack.json") job rows"
	[ -e "$D/knobs" ] && echo "knobs: $(grep -o '[A-Z_]*:=[^}]*' "$D/knobs" | tr '\n' ' ')"
	return 0
}

env_setup() {
	# the workers link OpenBLAS, which only their cpu paths call: a stub on the GPU machine
	# (built under a name of its own and renamed: two background runs may ask at once)
	cpu_lane || [ -e "$D/lib/libopenblas.so.0" ] || { cc -O2 -shared -fPIC -o "$D/lib/.blas.$$" "$ROOT/scripts/gpucarry/blas_stub.c" &&
		mv "$D/lib/.blas.$$" "$D/lib/libopenblas.so.0"; } || return 1
	export LD_LIBRARY_PATH="$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
	if NV=$(python3 -c 'import nvidia, os; print(list(nvidia.__path__)[0])' 2>/dev/null); then
		for d in $(find "$NV" -name 'libcudnn.so.9' -o -name 'libcublas.so.1[23]' -o -name 'libnvrtc.so*' 2>/dev/null | xargs -r -n1 dirname | sort -u); do
			LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
		done
	fi
	export FRAMEPACK_NATIVE_DIR=$SRC/build/native
	# results an earlier machine produced, carried back
	for f in "$ROOT"/build/e2e/results/*.json; do
		[ -e "$f" ] && [ ! -e "$D/out/$(basename "$f")" ] && cp "$f" "$D/out/"
	done
	return 0
}

# snapshot: the tracked tree copied once into $SRC (a background phase reads the copy, which
# no later call re-sends under it); build and models may ask at once
snapshot() {
	cpu_lane && return 0
	(
		flock 9
		[ -e "$SRC/.snapshot" ] || { rm -rf "$SRC" && mkdir -p "$SRC" && cp -a "$ROOT"/. "$SRC"/ && rm -rf "$SRC/build/e2e" && touch "$SRC/.snapshot"; }
	) 9>"$D/snapshot.lock"
}

# reference sources (diffusers, diffusers_helper) beside the snapshot's scripts
ref_setup() {
	[ -d "$SRC/third_party_ref" ] || tar -C "$SRC" -xJf "$1/third_party_ref.tar.xz"
}

# waitfor NAME SECONDS: until $D/NAME.ok exists (0), $D/NAME.failed exists or time is out (1)
waitfor() {
	local t0=$SECONDS said=
	while [ ! -e "$D/$1.ok" ]; do
		[ -e "$D/$1.failed" ] && { say "$1 failed: see its log"; return 1; }
		[ $((SECONDS - t0)) -ge "$2" ] && { say "no $1 after $2 s"; return 1; }
		[ -z "$said" ] && say "waiting for $1" && said=1
		sleep 2
	done
}

# need_bundle waits (up to $PREP_WAIT s, 0 in the foreground) for the whole bundle in $D/pkg:
# a background run started with the first part goes on once the last one is unpacked
need_bundle() {
	local t0=$SECONDS limit=0
	[ -n "${GPU_E2E_BG:-}" ] && limit=${PREP_WAIT:-1500}
	while [ ! -e "$D/pkg.ok" ]; do
		if [ $((SECONDS - t0)) -ge "$limit" ]; then
			say "the bundle is not staged in $D: carry build/e2e/N and run its gpu-e2e.sh stage first"
			exit 2
		fi
		sleep 2
	done
}

# early_pkg waits (up to $EARLY_WAIT s) for the bundle's first members and prints their folder
early_pkg() {
	local t0=$SECONDS
	until [ -e "$D/early/.ok" ] || [ -e "$D/pkg.ok" ]; do
		[ $((SECONDS - t0)) -ge "${EARLY_WAIT:-900}" ] && { say "mkmodels never arrived: stage the parts" >&2; return 1; }
		sleep 2
	done
	if [ -e "$D/pkg.ok" ]; then echo "$D/pkg"; else echo "$D/early/pkg"; fi
}

# early_extract unpacks the bundle's first members from the parts here, once they hold them
early_extract() {
	[ -e "$D/early/.ok" ] && return 0
	[ -e "$D/parts/EARLY" ] || return 0
	local files=() i=0
	while [ -e "$D/parts/part.$(printf %02d $i)" ]; do
		files+=("$D/parts/part.$(printf %02d $i)")
		i=$((i + 1))
	done
	[ ${#files[@]} -gt 0 ] || return 0
	rm -rf "$D/early.tmp" && mkdir -p "$D/early.tmp"
	cat "${files[@]}" | xz -dc 2>/dev/null | tar -C "$D/early.tmp" -xf - 2>/dev/null
	if (cd "$D/early.tmp" && sha256sum --quiet -c "$D/parts/EARLY" >/dev/null 2>&1); then
		rm -rf "$D/early" && mv "$D/early.tmp" "$D/early" && touch "$D/early/.ok" && say "early members unpacked from $i parts: $(cut -c67- "$D/parts/EARLY" | tr '\n' ' ')"
	else
		rm -rf "$D/early.tmp"
	fi
}

# ours_run BUDGETS [extra e2e flags…]: the harness at those budgets
ours_run() {
	local budgets=$1
	shift
	need_bundle
	env_setup || status=1
	{ cpu_lane || waitfor build "${PREP_WAIT:-1500}"; } && waitfor models "${PREP_WAIT:-1500}" || {
		status=1
		return
	}
	local job=(-steps "$STEPS" -seconds "${JOB_SECONDS:-4}" -long-seconds "${LONG_SECONDS:-60}" -long-gb "${LONG_GB:-16}" -long-steps "${LONG_STEPS:-5}")
	[ -n "${TINY:-}" ] && job=(-width 96 -height 64 -resolution 96 -window 3 -steps 2 -seconds 0.5 -long-seconds 2 -long-gb 1 -long-steps 1)
	[ -n "${DEVICE_GIB:-}" ] && job+=(-device-gib "$DEVICE_GIB")
	local limit=${E2E_LIMIT:-8m}
	[ -n "${GPU_E2E_BG:-}" ] && limit=${E2E_LIMIT:-0}
	"$D/pkg/bin/e2e" -bin "$D/pkg/bin" -models "$D/models" -out "$D/out" -lane "$LANE" -budgets "$budgets" -twice "${TWICE-}" \
		"${job[@]}" -limit "$limit" "$@" 2>&1 | tee -a "$D/out/ours.log"
	[ "${PIPESTATUS[0]}" = 0 ] || status=1
}

# run_phase runs one phase with a status of its own (a failed phase before it stops nothing) and
# keeps a failure in the run's status
run_phase() {
	local phase=$1 t0=$SECONDS outer=$status
	status=0
	case $phase in
	stage)
		cp "$HERE"/part.* "$D/parts/" && cp "$HERE/SHA256SUMS" "$D/parts/" && { [ ! -e "$HERE/EARLY" ] || cp "$HERE/EARLY" "$D/parts/"; }
		early_extract
		if (cd "$D/parts" && sha256sum --quiet -c SHA256SUMS >/dev/null 2>&1); then
			rm -rf "$D/pkg" "$D/pkg.ok" && cat "$D"/parts/part.* | xz -dc | tar -C "$D" -xf - && cp "$D/pkg/gpu-e2e.sh" "$D/gpu-e2e.sh" &&
				touch "$D/pkg.ok" && say "staged: every part is here; unpacked into $D/pkg" || status=1
		else
			say "part $(basename "$HERE") stored; $(ls "$D"/parts/part.* | wc -l) of $(wc -l <"$D/parts/SHA256SUMS") parts here"
		fi
		;;
	build)
		if cpu_lane; then say "cpu lane: nothing to build"; elif [ -e "$SRC/build/native/libfpk-cuda.so" ]; then say "libfpk-cuda.so kept"; else
			rm -f "$D/build.ok" "$D/build.failed"
			snapshot && OUT="$D/out/gpucheck" CUDA_ARCHS=${CUDA_ARCHS:-90} bash "$SRC/scripts/gpu-check.sh" build >"$D/out/build.log" 2>&1 || status=1
			[ -e "$SRC/build/native/libfpk-cuda.so" ] || status=1
			tail -3 "$D/out/build.log"
		fi
		if [ $status = 0 ]; then touch "$D/build.ok"; else touch "$D/build.failed"; fi
		;;
	models)
		rm -f "$D/models.ok" "$D/models.failed"
		local pkg
		pkg=$(early_pkg) || status=1
		if [ $status = 0 ]; then
			env_setup || status=1
			snapshot || status=1
			man=(-manifests "$D/manifests")
			if [ -n "${TINY:-}" ]; then man=(-shard-mb 2); else
				ref_setup "$pkg" || status=1
				python3 "$SRC/scripts/gpubench/torch_bench.py" --out "$D/manifests" --manifests-only >"$D/out/manifests.log" 2>&1 || {
					status=1
					tail -5 "$D/out/manifests.log"
				}
			fi
			"$pkg/bin/mkmodels" -fixtures "$SRC/testdata/parity/models" "${man[@]}" -out "$D/models" | tee "$D/out/mkmodels.log"
			[ "${PIPESTATUS[0]}" = 0 ] || status=1
			df -h "$D" | tail -1
		fi
		if [ $status = 0 ]; then touch "$D/models.ok"; else touch "$D/models.failed"; fi
		;;
	ours)
		ours_run "${BUDGETS:-keep,all,16,6}"
		;;
	long)
		ours_run long -long-timeout "${LONG_TIMEOUT:-40m}"
		;;
	extra)
		ours_run "${EXTRA_BUDGETS:-24,8}"
		;;
	fp8)
		ours_run "${FP8_BUDGETS:-fp8-keep,fp8-16,fp8-6}" -fp8-compute "${FP8_COMPUTE:-token}"
		;;
	framepack)
		local pkg
		pkg=$(early_pkg) || status=1
		env_setup || status=1
		waitfor models "${PREP_WAIT:-1500}" || {
			status=1
			return
		}
		snapshot && ref_setup "$pkg" || status=1
		local runs=() r
		for m in ${FP_MODES:-high low}; do
			if [ "$m" = low ]; then for b in ${FP_BUDGETS:-16 6}; do runs+=("low $b"); done; else runs+=("high 0"); fi
		done
		for r in "${runs[@]}"; do
			set -- $r
			local beside=()
			[ -e "$D/build.ok" ] || cpu_lane || beside=(--beside "the native build (nvcc) was running when this run started")
			[ -n "${FP_WRITE_VIDEO:-}" ] && beside+=(--write-video "$D/out/framepack-video")
			say "framepack $1 $2"
			PYTHONUNBUFFERED=1 timeout "${FP_TIMEOUT:-900}" python3 "$pkg/framepack_e2e.py" --third-party "$SRC/third_party_ref" --models "$D/models" \
				--out "$D/out/framepack.json" --mode "$1" --budget "$2" --steps "$STEPS" --seconds "${JOB_SECONDS:-4}" --skip-done "${beside[@]}" \
				>>"$D/out/framepack.log" 2>&1 || status=1
			grep -E '^framepack' "$D/out/framepack.log" | tail -1
		done
		;;
	report)
		need_bundle
		local gpu=cpu short f fp=()
		cpu_lane || gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 | head -1)
		short=$(echo "$gpu" | tr 'A-Z' 'a-z' | grep -oE 'h100|h200|a100|l40s|[a-z]?[0-9]{3,4}' | head -1)
		f="$D/out/$(date -u +%F)-${short:-gpu}-e2e.json"
		[ -e "$D/out/framepack.json" ] && fp=(-framepack "$D/out/framepack.json")
		"$D/pkg/bin/e2e" -out "$D/out" -budgets "keep,all,24,16,8,6,cold,${BUDGETS:-},${EXTRA_BUDGETS:-},fp8-keep,fp8-all,fp8-24,fp8-16,fp8-8,fp8-6,${FP8_BUDGETS:-},long" -report "$f" "${fp[@]}" -gpu "$gpu" >"$D/out/table.md"
		[ "${PIPESTATUS[0]}" = 0 ] || status=1
		head -c 9000 "$D/out/table.md"
		echo
		;;
	*)
		say "unknown phase $phase"
		exit 2
		;;
	esac
	say "$phase done in $((SECONDS - t0)) s$([ "$status" = 0 ] || echo ", status $status")"
	[ "$status" = 0 ] && status=$outer
}

# bg A+B+…: the phases in a new session, from a copy of this script (a later stage replaces it);
# the session's first process records its pid and, at the end, the run's exit status
start_bg() {
	local name=$1 self
	if [ -e "$D/bg/$name.pid" ] && [ ! -e "$D/bg/$name.rc" ] && kill -0 "$(cat "$D/bg/$name.pid")" 2>/dev/null; then
		say "bg $name is already running"
		return
	fi
	self=$D/bg/$name.sh
	cp "$0" "$self"
	rm -f "$D/bg/$name.rc" "$D/bg/$name.seen"
	# shellcheck disable=SC2016
	(cd "$ROOT" && GPU_E2E_BG=1 OUT='' setsid nohup bash -c 'echo $$ >"$1"; rc=$2; shift 2; bash "$@"; echo $? >"$rc"' \
		_ "$D/bg/$name.pid" "$D/bg/$name.rc" "$self" ${name//+/ } >>"$D/out/bg-$name.log" 2>&1 </dev/null &)
	local t0=$SECONDS
	while [ ! -s "$D/bg/$name.pid" ] && [ $((SECONDS - t0)) -lt 10 ]; do sleep 0.1; done
	say "bg $name started (log $D/out/bg-$name.log)"
}

# wait_bg S: follow the background runs for up to S seconds (each log's lines shown once, across
# calls too)
wait_bg() {
	local limit=$1 t0=$SECONDS running f n seen p
	while :; do
		for f in "$D"/out/bg-*.log; do
			[ -e "$f" ] || continue
			n=$(wc -l <"$f")
			seen=$(cat "$f.seen" 2>/dev/null || echo 0)
			[ "$n" -gt "$seen" ] && sed -n "$((seen + 1)),${n}p" "$f" | grep -E '^(gpu-e2e|e2e|framepack )' | cut -c1-300
			echo "$n" >"$f.seen"
		done
		running=0
		for p in "$D"/bg/*.pid; do
			[ -e "$p" ] || continue
			[ -e "${p%.pid}.rc" ] || running=$((running + 1))
		done
		[ $running = 0 ] && break
		[ $((SECONDS - t0)) -ge "$limit" ] && break
		sleep 5
	done
	progress
	if [ $running -gt 0 ]; then
		say "$running background run(s) still running after $((SECONDS - t0)) s: call wait again"
		return 3
	fi
	if grep -qv '^0$' "$D"/bg/*.rc 2>/dev/null; then
		say "a background run failed: see its log"
		return 1
	fi
	say "every background run ended well"
	return 0
}

args=("$@")
[ ${#args[@]} -eq 0 ] && args=(all)
[ "${args[0]}" = all ] && args=(build models framepack ours long report)
i=0
while [ $i -lt ${#args[@]} ]; do
	a=${args[$i]}
	case $a in
	bg)
		i=$((i + 1))
		start_bg "${args[$i]}"
		;;
	wait)
		w=${WAIT_S:-540}
		if [[ ${args[$((i + 1))]:-} =~ ^[0-9]+$ ]]; then
			i=$((i + 1))
			w=${args[$i]}
		fi
		wait_bg "$w"
		rc=$?
		[ $rc != 0 ] && status=$rc
		;;
	*) run_phase "$a" ;;
	esac
	publish
	i=$((i + 1))
done
say "exit $status"
exit $status
