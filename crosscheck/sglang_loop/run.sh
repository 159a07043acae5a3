#!/usr/bin/env bash
# Loop-level differential check: the same request scripts through SGLang's real event loops
# (sglang_side.py) and through kvadmit's Engine (kvadmit_side.py), compared event by event.
#
#   crosscheck/sglang_loop/run.sh            # quick run, about a minute on 2 slow cores
#   FULL=1 crosscheck/sglang_loop/run.sh     # the measured suite (>= 100,000 steps per version x loop;
#                                            # SEEDS="101 102 ..." overrides its seeds)
#   MUTATE=1 ...                             # also the mutation check (each altered rule must be caught)
#   VERSIONS="0.5.22 0.5.23" LOOPS="normal overlap" ...   # which SGLang versions and loops
#   PRIORITY=0.33 MIXED=0.33 ...             # the share of scenarios with priority scheduling (fcfs,
#                                            # priorities 0..30) and with --enable-mixed-chunk (the
#                                            # default: a third each, drawn apart; 1: all, 0: none)
#   REUSE_SGLANG=1 WORK=DIR ...              # keep SGLang's records already in DIR (rerun kvadmit only)
#
# Environment: KV_PY (kvadmit's python, default the repo's .venv), VENV_0_5_22 / VENV_0_5_23 (the SGLang
# venvs; ../sglang_scheduler/setup.sh makes them: VERSION=0.5.23 for the second), WORK (where the files
# go, default a new /tmp/kvadmit-loopcheck.XXXXXX; never inside the repo).
# The overlap loop is skipped (and said so) while kvadmit's ServerArgs has no disable_overlap_schedule.
# Prints a table per version x loop; exits non-zero on any mismatch or error, or a mutation not caught.
set -Eeuo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
KV_PY="${KV_PY:-$REPO/.venv/bin/python}"
VERSIONS="${VERSIONS:-0.5.22}"
LOOPS="${LOOPS:-normal overlap}"
export PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}"

if [ ! -x "$KV_PY" ]; then
	echo "run.sh: no kvadmit python at $KV_PY; run 'make setup' in $REPO or set KV_PY" >&2
	exit 2
fi
WORK="${WORK:-$(mktemp -d /tmp/kvadmit-loopcheck.XXXXXX)}"
case "$(realpath -m "$WORK")/" in
"$REPO"/*)
	echo "run.sh: WORK=$WORK is inside the repository; put it elsewhere" >&2
	exit 2
	;;
esac
mkdir -p "$WORK"

venv_for() {
	local var="VENV_${1//./_}"
	if [ -n "${!var:-}" ]; then
		echo "${!var}"
	elif [ "$1" = "0.5.22" ]; then
		echo /tmp/kvadmit-sglang-venv
	else
		echo "/tmp/kvadmit-sglang-${1//./}-venv"
	fi
}

has_overlap=$("$KV_PY" -c 'import dataclasses
from kvadmit.config import ServerArgs
print(int("disable_overlap_schedule" in {f.name for f in dataclasses.fields(ServerArgs)}))')

# Quick: one seed, a few scenarios. FULL: fixed seeds, sized for >= 100,000 launched batches each.
if [ "${FULL:-0}" = 1 ]; then
	SEEDS="${SEEDS:-101 102 103 104}"
	COUNT=60
else
	SEEDS="${SEED:-1}"
	COUNT="${COUNT:-8}"
fi

status=0
start=$SECONDS
for version in $VERSIONS; do
	venv="$(venv_for "$version")"
	if [ ! -x "$venv/bin/python" ]; then
		echo "run.sh: no SGLang $version venv at $venv (VERSION=$version $HERE/../sglang_scheduler/setup.sh)" >&2
		exit 2
	fi
	for loop in $LOOPS; do
		overlap=0
		[ "$loop" = overlap ] && overlap=1
		if [ "$overlap" = 1 ] && [ "$has_overlap" = 0 ]; then
			echo "== SGLang $version, $loop loop: skipped (this kvadmit has no overlap loop yet)"
			continue
		fi
		tag="$version-$loop"
		: >"$WORK/$tag.scenarios.jsonl"
		for seed in $SEEDS; do
			"$KV_PY" "$HERE/gen.py" "$seed" "$COUNT" --overlap "$overlap" --version "$version" \
				--abort-fraction 0.1 --priority "${PRIORITY:-0.33}" --mixed "${MIXED:-0.33}" \
				>>"$WORK/$tag.scenarios.jsonl"
		done
		if [ "${REUSE_SGLANG:-0}" = 1 ] && [ -s "$WORK/$tag.sglang.jsonl" ]; then
			echo "== SGLang $version, $loop loop: its records reused from $WORK/$tag.sglang.jsonl"
		else
			"$venv/bin/python" "$HERE/sglang_side.py" "$WORK/$tag.scenarios.jsonl" \
				>"$WORK/$tag.sglang.jsonl" 2>"$WORK/$tag.sglang.log"
		fi
		"$KV_PY" "$HERE/kvadmit_side.py" "$WORK/$tag.scenarios.jsonl" >"$WORK/$tag.kvadmit.jsonl"
		echo "== SGLang $version, $loop loop"
		"$KV_PY" "$HERE/compare.py" "$WORK/$tag.scenarios.jsonl" "$WORK/$tag.sglang.jsonl" \
			"$WORK/$tag.kvadmit.jsonl" --mismatches "$WORK/$tag.mismatches.jsonl" || status=1
		if [ "${MUTATE:-0}" = 1 ]; then
			"$KV_PY" "$HERE/mutation_check.py" "$WORK/$tag.scenarios.jsonl" "$WORK/$tag.sglang.jsonl" || status=1
		fi
	done
done
echo "run.sh: $((SECONDS - start)) s; files under $WORK"
exit $status
