#!/usr/bin/env bash
# Differential check: kvadmit's admission / retraction answers vs SGLang 0.5.22's own scheduler code.
#
#   crosscheck/sglang_scheduler/run.sh [COUNT] [SEED]    # quick run, about a minute on 2 slow cores
#   FULL=1 crosscheck/sglang_scheduler/run.sh            # the whole measured suite (172,411 snapshots)
#   MUTATE=1 ...                                         # also run the mutation sensitivity check
#
# Quick run: COUNT (default 3000) random snapshots from gen.py, plus COUNT/300 boundary-sweep bases
# (gen_sweep.py, ~650 snapshots each) and COUNT/50 threshold-centred bases (gen_medium.py, 21 each),
# all from SEED (default 1). FULL=1 ignores COUNT and SEED and runs the fixed seeds of README.md.
# For each suite: generate, drop what kvadmit rejects as invalid (validate.py), answer with
# `python -m kvadmit capacity --scenario FILE --json` (the repo's .venv), answer with SGLang's code
# (harness.py in the venv setup.sh makes), compare every field (compare.py), count edge cases (stats.py).
#
# Environment: VENV (SGLang venv, default /tmp/kvadmit-sglang-venv; run setup.sh first),
# WORK (where the files go, default a new /tmp/kvadmit-crosscheck.XXXXXX; never inside the repo).
# Prints one line per suite, then "compared: N admission, M decode; mismatches: ...; errors: ...".
# Exits non-zero on any mismatch, any error on either side, or (MUTATE=1) a mutation check with no
# disagreement. Everything else (per-suite counts, mismatching snapshots) is under $WORK.
set -Eeuo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
KV_PY="$(dirname "$0")/../../.venv/bin/python"
VENV="${VENV:-/tmp/kvadmit-sglang-venv}"
SG_PY="$VENV/bin/python"
COUNT="${1:-3000}"
SEED="${2:-1}"

if [ ! -x "$KV_PY" ]; then
	echo "run.sh: no kvadmit venv at $KV_PY; run 'make setup' in $REPO first" >&2
	exit 2
fi
if [ ! -x "$SG_PY" ]; then
	echo "run.sh: no SGLang venv at $VENV; run $HERE/setup.sh first" >&2
	exit 2
fi
WORK="${WORK:-$(mktemp -d /tmp/kvadmit-crosscheck.XXXXXX)}"
case "$(realpath -m "$WORK")/" in
"$REPO"/*)
	echo "run.sh: WORK=$WORK is inside the repository; put it elsewhere" >&2
	exit 2
	;;
esac
mkdir -p "$WORK"
LOG="$WORK/run.log"
: >"$LOG"
trap 'echo "run.sh: failed (exit $?); log: $LOG" >&2' ERR

# suite NAME PROBE GENERATOR ARGS... : one suite end to end; GENERATOR writes to its 3rd positional.
SUITES=()
suite() {
	local name="$1" probe="$2" gen="$3"
	shift 3
	local w="$WORK/$name"
	echo "### $name: $gen $*" >>"$LOG"
	"$KV_PY" "$HERE/$gen" "$@" "$w.raw.jsonl" 2>>"$LOG"
	"$KV_PY" "$HERE/validate.py" "$w.raw.jsonl" "$w.snaps.jsonl" 2>"$w.validate.txt"
	cat "$w.validate.txt" >>"$LOG"
	"$KV_PY" -m kvadmit capacity --scenario "$w.snaps.jsonl" --json >"$w.kvadmit.jsonl" 2>>"$LOG"
	DIFF_PROBE="$probe" "$SG_PY" "$HERE/harness.py" "$w.snaps.jsonl" >"$w.sglang.jsonl" 2>>"$LOG"
	"$KV_PY" "$HERE/compare.py" "$w.snaps.jsonl" "$w.kvadmit.jsonl" "$w.sglang.jsonl" \
		--mismatches "$w.mismatches.jsonl" --summary "$w.compare.json" >"$w.compare.txt"
	"$KV_PY" "$HERE/stats.py" "$w.snaps.jsonl" "$w.sglang.jsonl" --summary "$w.stats.json" >>"$w.compare.txt"
	cat "$w.compare.txt" >>"$LOG"
	read -r _ kept _ rejected _ <"$w.validate.txt"
	echo "suite $name ($kept snapshots; $rejected more generated that kvadmit rejects as invalid): $(head -1 "$w.compare.txt")"
	SUITES+=("$name")
}

START=$SECONDS
if [ "${FULL:-0}" = 1 ]; then
	echo "run.sh: full suite (fixed seeds); work dir $WORK"
	suite random-100 0 gen.py 100 3000 --decode-fraction 0.35
	suite random-101 0 gen.py 101 3000 --decode-fraction 0.5
	suite random-102 0 gen.py 102 5000 --decode-fraction 0.35
	suite random-103 0 gen.py 103 5000 --decode-fraction 0.6
	suite random-500-unaligned 0 gen.py 500 4000 --decode-fraction 0.0 --unaligned
	suite sweep-200 1 gen_sweep.py 200 150 --decode-fraction 0.2
	suite sweep-8-decode 1 gen_sweep.py 8 400 --decode-fraction 1.0
	suite sweep-400-paged-prefix 1 gen_sweep.py 400 60 --decode-fraction 0.25 --focus paged_prefix
	suite medium-300 1 gen_medium.py 300 1000
	suite medium-501-unaligned 1 gen_medium.py 501 600 --unaligned
else
	echo "run.sh: quick run, COUNT=$COUNT SEED=$SEED; work dir $WORK"
	suite "random-$SEED" 0 gen.py "$SEED" "$COUNT" --decode-fraction 0.35
	suite "sweep-$SEED" 1 gen_sweep.py "$SEED" $(((COUNT + 299) / 300)) --decode-fraction 0.3
	suite "medium-$SEED" 1 gen_medium.py "$SEED" $(((COUNT + 49) / 50))
fi

COMPARE=() STATS=()
for name in "${SUITES[@]}"; do
	COMPARE+=("$WORK/$name.compare.json")
	STATS+=("$WORK/$name.stats.json")
done
"$KV_PY" "$HERE/stats.py" --total "${STATS[@]}" >"$WORK/stats-total.txt"
echo "edge cases exercised (SGLang's answers):"
sed 's/^/  /' "$WORK/stats-total.txt"

status=0
if [ "${MUTATE:-0}" = 1 ]; then
	differ=0 total=0
	for name in "${SUITES[@]}"; do
		out="$("$SG_PY" "$HERE/mutation_check.py" "$WORK/$name.snaps.jsonl" "$WORK/$name.kvadmit.jsonl" 2>>"$LOG" || true)"
		echo "mutation $name: $out" >>"$LOG"
		read -r d n <<<"$(sed -n 's/.*: \([0-9]*\) of \([0-9]*\) differ/\1 \2/p' <<<"$out")"
		differ=$((differ + ${d:-0})) total=$((total + ${n:-0}))
	done
	echo "mutation check: $differ of $total snapshots differ once two SGLang rules are altered (must be > 0)"
	[ "$differ" -gt 0 ] || status=1
fi

echo "run.sh: $((SECONDS - START)) s; files under $WORK"
"$KV_PY" "$HERE/compare.py" --total "${COMPARE[@]}" || status=1
exit "$status"
