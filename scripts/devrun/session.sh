#!/usr/bin/env bash
# session.sh — one device call that makes the references and checks against them:
#   1. starts the reference generators on the CPUs in the background (refs.sh start; GENS,
#      REF_THREADS as there),
#   2. runs scripts/gpu-check.sh $PHASES on the GPU meanwhile (default: build),
#   3. waits up to $REFS_WAIT s (300) for the generators, copies the cases they wrote into
#      testdata/reference/cases and runs gpu-check.sh $AFTER (default: features), the phases that
#      read them,
#   4. collects refs.tar.gz (cases and logs) into $OUT.
# Each gpu-check run writes under $OUT/<n>-<phases>/ (log.txt, summary.txt); the summaries are
# printed at the end.
set -uo pipefail
ROOT=$PWD
OUT=${OUT:-$ROOT/build/devrun}
PHASES=${PHASES:-build}
AFTER=${AFTER:-features}
REFS_WAIT=${REFS_WAIT:-300}
D=${D:-/tmp/fpk-refs}
export D
mkdir -p "$OUT"
status=0
bash scripts/devrun/refs.sh start
# shellcheck disable=SC2086 # phase lists
OUT=$OUT/1-${PHASES// /_} bash scripts/gpu-check.sh $PHASES || status=1
want=$(wc -w <<<"${GENS:-gen_fp8 gen_pipeline_features}")
t0=$SECONDS
until [ "$(grep -c '^== .* exit ' "$D/progress.txt" 2>/dev/null)" -ge "$want" ]; do
	if [ $((SECONDS - t0)) -ge "$REFS_WAIT" ]; then
		echo "session: the generators are still running after ${REFS_WAIT} s" >&2
		status=1
		break
	fi
	sleep 5
done
cat "$D/progress.txt"
cp -f "$D"/out/testdata/reference/cases/* testdata/reference/cases/ 2>/dev/null
# shellcheck disable=SC2086
[ -n "$AFTER" ] && { OUT=$OUT/2-${AFTER// /_} bash scripts/gpu-check.sh $AFTER || status=1; }
OUT=$OUT bash scripts/devrun/refs.sh collect
for s in "$OUT"/*/summary.txt; do
	echo "== $s"
	cat "$s"
done
exit $status
