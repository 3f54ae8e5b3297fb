#!/usr/bin/env bash
# gpu-multi.sh — several GPUs in one host, on real hardware (issue 34): one framepackd with one
# lane per GPU (--lanes cuda:0,cuda:1), full-size random checkpoints, the CLI; per-process GPU
# memory from NVML (nvidia-smi --query-compute-apps every 200 ms).
#
#   bash scripts/multigpu/gpu-multi.sh PHASE...     from the repository root on the GPU machine
#
# It runs on what scripts/gpue2e stages (binaries in $D/pkg/bin, models in $D/models): carry
# and stage the gpue2e bundle and run its `build models` phases first (scripts/multigpu/README.md).
#
# alone      one job on each lane by itself (pinned with --lane): wall time, output hash
# together   two unpinned jobs submitted at once: placement gives each a lane; each job's
#            worker processes must appear in NVML only on its lane's GPU; wall times against
#            alone; outputs equal to the single-GPU run's, bit for bit
# hold       jobs pinned to each lane; while lane 0's transformer samples, a blocker takes GPU
#            memory on GPU 0 and the transformer worker is SIGKILLed: the memory does not come
#            back, lane 0 is held (framepack devices), lane 1 finishes its job meanwhile; the
#            blocker goes, lane 0 recovers and its job finishes with the alone run's output
# placement  a blocker leaves GPU 0 less free memory than GPU 1: an unpinned job goes to the
#            least-loaded lane (cuda:1); a job whose --gpu-preserve only GPU 1 can give goes there
#            even with GPU 0 idle; a second job pinned to a busy lane waits for it (QUEUED) while
#            the other lane idles
# report     docs/bench/<date>-<gpu>-x<N>-multigpu.json (and table.md) from the phases' files
# all        alone together hold placement report
#
# Knobs: D (/tmp/fpk-e2e), LANES (cuda:0,cuda:1), STEPS (25), SECS (1: one section at window 9),
# RES (640), BLOCK_GIB (hold's blocker, 16). Dry run of alone/together/report on a machine without
# GPUs (checks the script): LANES=cpu:0,cpu:1 TINY=1 D=/tmp/fpk-multi-dry gpu-multi.sh alone together report
set -uo pipefail
ROOT=$PWD
D=${D:-/tmp/fpk-e2e}
M=$D/multi
LANES=${LANES:-cuda:0,cuda:1}
IFS=, read -r -a LANE_LIST <<<"$LANES"
BIN=${BIN:-$D/pkg/bin}
MODELS=${MODELS:-$D/models}
SOCK=$M/d.sock
mkdir -p "$M/out"
status=0
say() { echo "gpu-multi: $*"; }
gpu() { [ "${LANE_LIST[0]%%:*}" != cpu ]; }
fp() { "$BIN/framepack" --addr "$SOCK" "$@"; }

JOB=(--prompt "The girl dances gracefully, with clear movements, full of charm." --seed 31337 --teacache=false
	--resolution "${RES:-640}" --window 9 --steps "${STEPS:-25}" --seconds "${SECS:-1}" --gpu-preserve 6)
IMAGE=$ROOT/testdata/demo/start.png
if [ -n "${TINY:-}" ]; then
	JOB=(--prompt "a cat" --seed 31337 --teacache=false --resolution 96 --window 3 --steps 2 --seconds 0.5 --gpu-preserve 0)
	MODELS=$ROOT/testdata/parity/models
fi

env_setup() {
	gpu || return 0
	export LD_LIBRARY_PATH="$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
	if NV=$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null); then
		for d in $(find "$NV" -name 'libcudnn.so.9' -o -name 'libcublas.so.1[23]' -o -name 'libnvrtc.so*' 2>/dev/null | xargs -r -n1 dirname | sort -u); do
			LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
		done
	fi
	export FRAMEPACK_NATIVE_DIR=$ROOT/build/native
}

# start_daemon NAME: a fresh daemon on every lane, its state in $M/NAME.
DPID=
start_daemon() {
	rm -rf "$M/$1" && mkdir -p "$M/$1"
	local backend=cuda
	gpu || backend=cpu
	"$BIN/framepackd" --models "$MODELS" --state "$M/$1/state" --socket "$SOCK" --lanes "$LANES" --backend "$backend" \
		--log-format json --grace 5s 2>"$M/$1/daemon.log" &
	DPID=$!
	for _ in $(seq 600); do
		fp health >/dev/null 2>&1 && return 0
		kill -0 $DPID 2>/dev/null || { say "daemon $1 died:"; tail -20 "$M/$1/daemon.log"; return 1; }
		sleep 0.2
	done
	say "daemon $1 not serving"
	return 1
}
stop_daemon() {
	[ -n "$DPID" ] && kill -TERM $DPID 2>/dev/null && wait $DPID 2>/dev/null
	DPID=
}

# NVML sampler: per-process GPU memory, every 200 ms, into $1.
SPID=
start_nvml() {
	gpu || return 0
	nvidia-smi --query-gpu=index,pci.bus_id,memory.total --format=csv,noheader,nounits >"${1%.csv}-gpus.csv"
	nvidia-smi --query-compute-apps=timestamp,pid,process_name,gpu_bus_id,used_memory --format=csv,noheader,nounits -lms 200 >"$1" 2>/dev/null &
	SPID=$!
}
stop_nvml() { [ -n "$SPID" ] && kill $SPID 2>/dev/null && wait $SPID 2>/dev/null; SPID=; }

# blocker GPU GIB: a process holding GIB of GPU memory until killed; prints its pid.
blocker() {
	python3 -c "import torch, time, sys; x = torch.empty(int($2 * (1 << 30)), dtype=torch.uint8, device='cuda:$1'); print('held', flush=True); time.sleep(3600)" >"$M/blocker-$1.log" 2>&1 &
	local pid=$!
	for _ in $(seq 300); do grep -q held "$M/blocker-$1.log" 2>/dev/null && break; sleep 0.1; done
	echo $pid
}

# job_id_of OUT: the job id a detached submit printed.
job_id_of() { grep -oE '\b[0-9a-z]{10}\b' "$1" | head -1; }

# finish NAME ID: wait for job ID, save its video, write NAME.json (wall time, lane, output hash).
finish() {
	local name=$1 id=$2 t0=$3 dir=$4
	fp watch "$id" --out "$M/$name.mp4" >"$M/$name.watch.log" 2>&1
	local rc=$?
	local t1=$(date +%s.%N)
	local lane=$(grep -ho '"lane":"[^"]*"' "$dir/state/jobs/$id/history/stages.jsonl" 2>/dev/null | sort -u | cut -d'"' -f4 | paste -sd' ')
	local wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
	local hash=$(cat "$dir"/state/jobs/"$id"/history/section-*.safetensors 2>/dev/null | sha256sum | cut -d' ' -f1)
	printf '{"name":"%s","job":"%s","exit":%d,"wall_s":%s,"lanes":"%s","output_sha256":"%s"}\n' \
		"$name" "$id" "$rc" "$wall" "$lane" "$hash" >"$M/out/$name.json"
	cp "$dir/state/jobs/$id/history/stages.jsonl" "$M/out/$name.stages.jsonl" 2>/dev/null
	say "$name: job $id on $lane, exit $rc, $wall s"
}

# submit NAME [ARGS]: a detached job, its id on stdout.
submit() {
	local name=$1
	shift
	fp generate --image "$IMAGE" "${JOB[@]}" --detach "$@" >"$M/$name.submit.log" 2>&1 || { cat "$M/$name.submit.log" >&2; return 1; }
	job_id_of "$M/$name.submit.log"
}

phases=("$@")
[ ${#phases[@]} -eq 0 ] && phases=(all)
[ "${phases[0]}" = all ] && phases=(alone together hold placement report)
[ -x "$BIN/framepackd" ] || { say "no binaries in $BIN: stage the gpue2e bundle first (scripts/multigpu/README.md)"; exit 2; }
env_setup
trap 'stop_nvml; stop_daemon' EXIT
for phase in "${phases[@]}"; do
	t0=$SECONDS
	case $phase in
	alone)
		start_daemon alone || { status=1; continue; }
		for i in "${!LANE_LIST[@]}"; do
			start_nvml "$M/out/alone-$i-nvml.csv"
			ts=$(date +%s.%N)
			pin=(--lane "${LANE_LIST[$i]}")
			[ -n "${TINY:-}" ] && pin=() # the daemon refuses jobs pinned to cpu:N lanes (no probed device)
			id=$(submit "alone-$i" "${pin[@]}") || { status=1; stop_nvml; continue; }
			finish "alone-$i" "$id" "$ts" "$M/alone"
			stop_nvml
		done
		fp devices >"$M/out/devices.txt" 2>&1
		stop_daemon
		;;
	together)
		start_daemon together || { status=1; continue; }
		start_nvml "$M/out/together-nvml.csv"
		ts=$(date +%s.%N)
		ids=()
		for i in "${!LANE_LIST[@]}"; do ids+=("$(submit "together-$i")") || status=1; done
		fpids=()
		for i in "${!ids[@]}"; do
			finish "together-$i" "${ids[$i]}" "$ts" "$M/together" &
			fpids+=($!)
		done
		wait "${fpids[@]}" # not the daemon's pid
		stop_nvml
		stop_daemon
		;;
	hold)
		gpu || { say "hold needs GPUs; skipped"; continue; }
		start_daemon hold || { status=1; continue; }
		start_nvml "$M/out/hold-nvml.csv"
		ts=$(date +%s.%N)
		a=$(submit hold-0 --lane "${LANE_LIST[0]}") && b=$(submit hold-1 --lane "${LANE_LIST[1]}") || { status=1; stop_daemon; continue; }
		# wait for lane 0's transformer worker in NVML
		bus0=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i "${LANE_LIST[0]#cuda:}")
		tpid=
		for _ in $(seq 3000); do
			tpid=$(nvidia-smi --query-compute-apps=pid,process_name,gpu_bus_id --format=csv,noheader | awk -F', ' -v b="$bus0" '$2 ~ /transformer/ && $3 == b {print $1}' | head -1)
			[ -n "$tpid" ] && break
			sleep 0.2
		done
		sleep 5 # mid-stage
		bpid=$(blocker "${LANE_LIST[0]#cuda:}" "${BLOCK_GIB:-16}")
		kill -KILL "$tpid" 2>/dev/null
		say "hold: blocker $bpid holds ${BLOCK_GIB:-16} GiB on GPU 0; killed transformer worker $tpid"
		sleep 15
		fp devices >"$M/out/hold-devices-held.txt" 2>&1
		fp jobs >"$M/out/hold-jobs-held.txt" 2>&1
		finish hold-1 "$b" "$ts" "$M/hold" # lane 1 serves while lane 0 is held
		kill "$bpid" 2>/dev/null
		say "hold: blocker gone"
		finish hold-0 "$a" "$ts" "$M/hold"
		fp devices >"$M/out/hold-devices-after.txt" 2>&1
		grep -E '"(lane held|memory not back|lane ready|memory back)[^"]*"' "$M/hold/daemon.log" | tail -20 >"$M/out/hold-lane-events.log"
		stop_nvml
		stop_daemon
		;;
	placement)
		gpu || { say "placement needs GPUs; skipped"; continue; }
		start_daemon placement || { status=1; continue; }
		total0=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i "${LANE_LIST[0]#cuda:}")
		# GPU 0 loaded: an unpinned job goes to the least-loaded lane
		bpid=$(blocker "${LANE_LIST[0]#cuda:}" 40)
		ts=$(date +%s.%N)
		p1=$(submit placement-least-loaded) || status=1
		finish placement-least-loaded "$p1" "$ts" "$M/placement"
		kill "$bpid" 2>/dev/null
		# only GPU 1 has what --gpu-preserve asks (GPU 0 keeps total-30 GiB busy)
		bpid=$(blocker "${LANE_LIST[0]#cuda:}" $(((total0 / 1024) - 30)))
		ts=$(date +%s.%N)
		p2=$(submit placement-memory --gpu-preserve 50) || status=1
		finish placement-memory "$p2" "$ts" "$M/placement"
		kill "$bpid" 2>/dev/null
		# two jobs pinned to lane 1: the second waits for it while lane 0 idles
		ts=$(date +%s.%N)
		q1=$(submit placement-pinned-1 --lane "${LANE_LIST[1]}") && q2=$(submit placement-pinned-2 --lane "${LANE_LIST[1]}") || status=1
		sleep 10
		fp jobs >"$M/out/placement-pinned-jobs.txt" 2>&1
		fp devices >"$M/out/placement-pinned-devices.txt" 2>&1
		finish placement-pinned-1 "$q1" "$ts" "$M/placement"
		finish placement-pinned-2 "$q2" "$ts" "$M/placement"
		stop_daemon
		;;
	report)
		name=cpu
		gpu && name=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 | head -1)
		short=$(echo "$name" | tr 'A-Z' 'a-z' | grep -oE 'h100|h200|a100|l40s|[a-z]?[0-9]{3,4}' | head -1)
		f="$M/out/$(date -u +%F)-${short:-gpu}-x${#LANE_LIST[@]}-multigpu.json"
		python3 "$ROOT/scripts/multigpu/report.py" --dir "$M/out" --gpu "$name" --lanes "$LANES" --out "$f" | tee "$M/out/table.md"
		[ "${PIPESTATUS[0]}" = 0 ] || status=1
		;;
	*)
		say "unknown phase $phase"
		exit 2
		;;
	esac
	say "$phase done in $((SECONDS - t0)) s"
	if [ -n "${OUT:-}" ]; then
		mkdir -p "$OUT" && cp -r "$M"/out/. "$OUT"/
		for l in "$M"/*/daemon.log; do [ -e "$l" ] && tail -c 300000 "$l" >"$OUT/$(basename "$(dirname "$l")")-daemon.log"; done
	fi
done
exit $status
