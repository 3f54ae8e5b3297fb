#!/usr/bin/env bash
# gpu-faults.sh — faults at full size on the GPU machine (issue 32; no Go there). One daemon in
# the carried test binary (supervisor/watchdog's TestGPUFaults) on a cuda lane, its workers under
# a $CAP_GIB (16) GiB cap, full-size random checkpoints, and a one-section job ($STEPS, default 8,
# sampling steps at the 640 bucket) run undisturbed and then once per fault:
#
#   transformer-sigkill   SIGKILL of the transformer worker after half its steps
#   transformer-sigstop   SIGSTOP of it there (a hang: the watchdog kills it after $OP_DEADLINE)
#   transformer-oom-load  an out of memory at its Load (Fault.oom_at_load)
#   transformer-oom-mid   an out of memory at the middle op of its stage
#   vae-sigkill-decode    SIGKILL of the VAE worker two thirds into its decode
#
# Each records when the worker was gone, when NVML showed the device memory back at the idle
# baseline (sampled every 20 ms), the retries (class, the ladder's next rung) and whether the
# job's latents and pixels hash as the undisturbed run's. The record is
# $OUT/<date>-<gpu>-faults.json, for docs/bench/.
#
#   scripts/gpufaults/bundle.sh           here (with Go): build/faults/N/ parts (scripts/gpufaults/README.md)
#   gpu-faults.sh stage                   there, from each carried part folder build/faults/N/
#   gpu-faults.sh build models run        there, from the repository root (the tracked tree)
#
# build   libfpk-cuda.so from the tracked native/ (scripts/gpu-check.sh build) unless built
# models  the full-size checkpoints: kept when $MODELS (default /tmp/fpk-e2e/models, where
#         gpu-e2e.sh writes them) is current, else the manifests (torch on the meta device) and
#         mkmodels (~43 GB)
# run     TestGPUFaults (about 4 minutes on an H100 at 8 steps); $SCENARIOS limits the faults
#
# Knobs: D (/tmp/fpk-faults), MODELS, STEPS, CAP_GIB, OP_DEADLINE (30s), SCENARIOS, CUDA_ARCHS.
# A dry run of the phases without a GPU (checks this script and the harness, not the GPU):
#   LANE=cpu TINY=1 gpu-faults.sh run        (the tiny fixture models, 96x64, op deadline 5 s)
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$PWD
D=${D:-/tmp/fpk-faults}
LANE=${LANE:-cuda:0}
MODELS=${MODELS:-/tmp/fpk-e2e/models}
mkdir -p "$D/parts" "$D/out" "$D/lib"
status=0
say() { echo "gpu-faults: $*"; }
gpu() { [ "${LANE%%:*}" != cpu ]; }

publish() {
	[ -n "${OUT:-}" ] || return 0
	mkdir -p "$OUT"
	cp "$D"/out/*.json "$OUT"/ 2>/dev/null
	for f in "$D"/out/*.log; do [ -e "$f" ] && tail -c 300000 "$f" >"$OUT/$(basename "$f")"; done
	return 0
}

# libraries: an OpenBLAS stub for the workers' cpu paths, cuDNN/cuBLAS/NVRTC from PyTorch's wheels
libs() {
	if gpu && [ ! -e "$D/lib/libopenblas.so.0" ]; then
		cc -O2 -shared -fPIC -o "$D/lib/libopenblas.so.0" "$ROOT/scripts/gpucarry/blas_stub.c" || return 1
	fi
	export LD_LIBRARY_PATH="$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
	local nv d
	nv=$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null) || return 0
	for d in $(find "$nv" \( -name 'libcudnn.so.9' -o -name 'libcublas.so.1[23]' -o -name 'libnvrtc.so*' \) -printf '%h\n' 2>/dev/null | sort -u); do
		LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
	done
	export FRAMEPACK_NATIVE_DIR=$ROOT/build/native
}

staged() {
	[ -x "$D/pkg/watchdog.test" ] || { say "the bundle is not staged in $D: carry build/faults/N and run its gpu-faults.sh stage first"; exit 2; }
}

phases=("$@")
[ ${#phases[@]} -eq 0 ] && phases=(build models run)
for phase in "${phases[@]}"; do
	t0=$SECONDS
	case $phase in
	stage)
		cp "$HERE"/part.* "$HERE/SHA256SUMS" "$D/parts/"
		if (cd "$D/parts" && sha256sum --quiet -c SHA256SUMS >/dev/null 2>&1); then
			rm -rf "$D/pkg" && cat "$D"/parts/part.* | xz -dc | tar -C "$D" -xf - && cp "$D/pkg/gpu-faults.sh" "$D/gpu-faults.sh" &&
				say "staged: unpacked into $D/pkg" || status=1
		else
			say "part $(basename "$HERE") stored; $(ls "$D"/parts/part.* | wc -l) of $(wc -l <"$D/parts/SHA256SUMS") parts here"
		fi
		;;
	build)
		if ! gpu || [ -e "$ROOT/build/native/libfpk-cuda.so" ]; then say "libfpk-cuda.so: nothing to build"; else
			OUT="$D/out/gpucheck" CUDA_ARCHS=${CUDA_ARCHS:-90} bash "$ROOT/scripts/gpu-check.sh" build >"$D/out/build.log" 2>&1 || status=1
			tail -3 "$D/out/build.log"
		fi
		;;
	models)
		staged
		libs || status=1
		if [ ! -d "$D/manifests" ] && [ ! -d "${MODELS%/models}/manifests" ]; then
			python3 "$ROOT/scripts/gpubench/torch_bench.py" --out "$D/manifests" --manifests-only >"$D/out/manifests.log" 2>&1 || { status=1; tail -5 "$D/out/manifests.log"; }
		fi
		man=$D/manifests
		[ -d "$man" ] || man=${MODELS%/models}/manifests
		# mkmodels keeps a folder whose stamp matches and writes only what is missing
		"$D/pkg/bin/mkmodels" -fixtures "$ROOT/testdata/parity/models" -manifests "$man" -out "$MODELS" | tee "$D/out/mkmodels.log" || status=1
		df -h "$MODELS" | tail -1
		;;
	run)
		staged
		libs || status=1
		gpu_name=cpu
		gpu && gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader -i "${LANE#*:}" | head -1)
		short=$(echo "$gpu_name" | tr 'A-Z' 'a-z' | grep -oE 'h100|h200|a100|l40s|[a-z]?[0-9]{3,4}|cpu' | head -1)
		rec="$D/out/$(date -u +%F)-${short:-gpu}-faults.json"
		args=(-gpufaults.models "$MODELS" -gpufaults.steps "${STEPS:-8}" -gpufaults.op-deadline "${OP_DEADLINE:-30s}")
		if [ -n "${TINY:-}" ]; then
			# the tiny steps take milliseconds and the step events lag behind them (each is stored
			# before it is sent): the signal goes after step 2 of 50, still mid-sampling
			args=(-gpufaults.models "$ROOT/testdata/parity/models" -gpufaults.tiny -gpufaults.steps "${STEPS:-50}" -gpufaults.signal-step 2 -gpufaults.op-deadline "${OP_DEADLINE:-5s}")
		fi
		gpu && nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader | tee "$D/out/gpu.txt"
		# the test binary reads nothing relative to its folder but runs from its package's, as go test does
		(cd "$ROOT/supervisor/watchdog" && FRAMEPACK_TEST_LOG=${FRAMEPACK_TEST_LOG-1} timeout 590 "$D/pkg/watchdog.test" \
			-test.run '^TestGPUFaults$' -test.v -test.count=1 -test.timeout 580s \
			-gpufaults.lane "$LANE" -gpufaults.workers "$D/pkg/bin" -gpufaults.cap-gib "${CAP_GIB:-16}" \
			-gpufaults.scenarios "${SCENARIOS:-}" -gpufaults.out "$rec" "${args[@]}") >"$D/out/run.log" 2>&1 || status=1
		grep -E '^(=== RUN|--- |    gpufaults_test|PASS|FAIL|ok)' "$D/out/run.log" | tail -20
		[ -e "$rec" ] && say "record: $rec"
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
