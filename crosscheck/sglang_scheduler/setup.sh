#!/usr/bin/env bash
# Make the throwaway venv that harness.py runs SGLang 0.5.22's scheduler code in (CPU only).
#
#   crosscheck/sglang_scheduler/setup.sh          # venv at ${VENV:-/tmp/kvadmit-sglang-venv}
#   VENV=/some/where PYTHON=python3.11 crosscheck/sglang_scheduler/setup.sh
#   VERSION=0.5.23 crosscheck/sglang_scheduler/setup.sh   # another release, venv at
#                                                         # /tmp/kvadmit-sglang-0523-venv
#
# VERSION (default 0.5.22) only changes the sglang wheel: everything else keeps the pins below. Another
# release is checked with ../sglang_loop/sglang_side.py --self-check (both event loops run); harness.py
# is checked against 0.5.22 only.
#
# Installs, all pinned by constraints.txt: torch==2.13.0 (the CPU release), sglang==0.5.22 and
# triton with --no-deps (SGLang's own dependency list would pull its whole serving stack and a CUDA
# torch), then the few packages SGLang's scheduler modules import (requirements.txt). Packages that
# SGLang imports but the scheduler never uses are stood in for by stubs.py, not installed.
# Idempotent: when the venv already answers harness.py --self-check, nothing is installed.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
VERSION="${VERSION:-0.5.22}"
if [ "$VERSION" = 0.5.22 ]; then
	VENV="${VENV:-/tmp/kvadmit-sglang-venv}"
	CHECK=("$HERE/harness.py" --self-check)
else
	VENV="${VENV:-/tmp/kvadmit-sglang-${VERSION//./}-venv}"
	CHECK=("$HERE/../sglang_loop/sglang_side.py" --self-check)
fi
PYTHON="${PYTHON:-python3.11}"

case "$(realpath -m "$VENV")/" in
"$REPO"/*)
	echo "setup.sh: VENV=$VENV is inside the repository; put it elsewhere (default /tmp/kvadmit-sglang-venv)" >&2
	exit 2
	;;
esac

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" "${CHECK[@]}" >/dev/null 2>&1; then
	echo "setup.sh: $VENV already runs SGLang $VERSION's scheduler code; nothing to do"
	exit 0
fi

if ! command -v "$PYTHON" >/dev/null; then
	echo "setup.sh: $PYTHON not found (SGLang 0.5.22 was checked with Python 3.11; set PYTHON=...)" >&2
	exit 2
fi

echo "setup.sh: making $VENV with $PYTHON"
"$PYTHON" -m venv "$VENV"
# The pins, with the sglang line set to VERSION.
sed "s/^sglang==.*/sglang==$VERSION/" "$HERE/constraints.txt" >"$VENV/constraints.txt"
pip_install() { "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -c "$VENV/constraints.txt" "$@"; }
pip_install torch==2.13.0
pip_install --no-deps "sglang==$VERSION" triton==3.9.0
# pip then lists SGLang's own requirements that --no-deps left out (its serving stack); expected.
pip_install -r "$HERE/requirements.txt" 2>"$VENV/pip-notes.log" || {
	cat "$VENV/pip-notes.log" >&2
	exit 1
}
[ -s "$VENV/pip-notes.log" ] && echo "setup.sh: pip's notes on SGLang requirements left out: $VENV/pip-notes.log"

"$VENV/bin/python" -c 'import torch; print("setup.sh: torch", torch.__version__, "cuda:", torch.version.cuda)'
"$VENV/bin/python" "${CHECK[@]}"
