#!/usr/bin/env bash
# Differential check of priority scheduling (priority_check.py): preemption at the request cap and
# --retraction-policy priority, kvadmit against SGLang 0.5.22's own code.
#
#   crosscheck/sglang_scheduler/run_priority.sh [COUNT] [SEED]     # default 2000 snapshots, seed 1
#
# Environment: VENV (SGLang venv, default /tmp/kvadmit-sglang-venv; run setup.sh first), KV_PY (the Python
# that runs kvadmit, default the repository's .venv), WORK (default a new /tmp directory).
set -Eeuo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
VENV="${VENV:-/tmp/kvadmit-sglang-venv}"
KV_PY="${KV_PY:-$REPO/.venv/bin/python}"
WORK="${WORK:-$(mktemp -d /tmp/kvadmit-priority-check.XXXXXX)}"
COUNT="${1:-2000}"
SEED="${2:-1}"
python3 "$HERE/priority_check.py" gen "$COUNT" "$SEED" > "$WORK/snaps.jsonl"
(cd "$HERE" && "$VENV/bin/python" priority_check.py sglang "$WORK/snaps.jsonl") > "$WORK/sglang.jsonl"
PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}" "$KV_PY" -m kvadmit capacity --scenario "$WORK/snaps.jsonl" --json \
    > "$WORK/kvadmit.jsonl"
python3 "$HERE/priority_check.py" compare "$WORK/snaps.jsonl" "$WORK/kvadmit.jsonl" "$WORK/sglang.jsonl"
