#!/usr/bin/env bash
# refs.sh — the float64 reference fixtures made from the reference code (testdata/reference/gen_*.py)
# on the GPU machine, which has PyTorch (this machine has none): on its CPUs, in the background
# while the GPU runs the benchmarks (they need no GPU and run at nice 19).
#
#   refs.sh start     unpack the reference sources (build/ref/third_party_ref.tar.xz: diffusers and
#                     FramePack's diffusers_helper; build/ref/studio.tar.xz: FramePack-Studio) into
#                     $D/ref and start the generators in a new session
#   refs.sh collect   tar what they wrote (cases and logs) into $OUT/refs.tar.gz
#
# GENS names the generators (default "gen_fp8 gen_pipeline_features"), REF_THREADS their
# threads (4). D defaults to /tmp/fpk-refs. Unpack the returned refs.tar.gz at the repository root: the cases
# land in testdata/reference/cases, the logs beside the scripts.
set -uo pipefail
ROOT=$PWD
D=${D:-/tmp/fpk-refs}
mkdir -p "$D/ref" "$D/out/testdata/reference/cases"
case ${1:-} in
start)
	[ -n "$(find "$D/ref" -maxdepth 3 -type d -name diffusers_helper)" ] || tar -C "$D/ref" -xJf "$ROOT/build/ref/third_party_ref.tar.xz"
	[ -d "$D/studio" ] || { [ -e "$ROOT/build/ref/studio.tar.xz" ] && tar -C "$D" -xJf "$ROOT/build/ref/studio.tar.xz"; }
	tp=$(dirname "$(find "$D/ref" -maxdepth 3 -type d -name diffusers_helper | head -1)")
	out="$D/out/testdata/reference/cases"
	setsid bash -c '
		cd "$0" || exit 1
		tp=$1 out=$2 D=$3
		for g in ${GENS:-gen_fp8 gen_pipeline_features}; do
			[ -e "testdata/reference/$g.py" ] || continue
			args=(--third-party "$tp" --out "$out")
			# --check: the timestep mode that reproduces testdata/parity (float64), recorded in the fixture
			[ "$g" = gen_pipeline_features ] && args+=(--studio "$D/studio" --check)
			echo "== $g $(date -u +%T)"
			OMP_NUM_THREADS=${REF_THREADS:-4} MKL_NUM_THREADS=${REF_THREADS:-4} nice -n 19 python3 "testdata/reference/$g.py" "${args[@]}" >"$D/out/testdata/reference/$g.log" 2>&1
			echo "== $g exit $? $(date -u +%T)"
		done
	' "$ROOT" "$tp" "$out" "$D" >"$D/progress.txt" 2>&1 </dev/null &
	echo "refs: started (third party: $tp)"
	;;
collect)
	cat "$D/progress.txt" 2>/dev/null
	tail -3 "$D"/out/testdata/reference/*.log 2>/dev/null
	[ -n "${OUT:-}" ] && tar -C "$D/out" -czf "$OUT/refs.tar.gz" . && ls -la "$OUT/refs.tar.gz"
	;;
*)
	echo "usage: refs.sh start|collect" >&2
	exit 2
	;;
esac
