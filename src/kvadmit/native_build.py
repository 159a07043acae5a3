"""Build the compiled core (`make fast`, also part of `make setup`): mypyc compiles the modules
kvadmit.native.COMPILED into src/kvadmit/_native/. Needs mypy (the `fast` extra) and a C compiler. When
either is missing or the build fails it prints one line, leaves no build behind and exits 0 (kvadmit
stays pure Python); --strict makes that exit 1.

    python -m kvadmit.native_build [--strict] [--clean]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from kvadmit.native import BUILD_DIR, COMPILED, PURE_ENV, STAMP, python_tag, source_hashes, source_path

# kvadmit/__init__.py's lazy `kvadmit.OfflineEngine` imports the torch executor: mypy must not follow it
# into torch (minutes and gigabytes of analysis for code that is never compiled).
MYPY_CONFIG = """[mypy]

[mypy-kvadmit.offline]
follow_imports = skip

[mypy-torch.*,numpy.*,transformers.*]
follow_imports = skip
"""


def _compile(work: Path, log: io.StringIO) -> Path:
    """mypyc, then the C compiler, in a scratch folder; returns the folder the extensions were built in."""
    from mypyc.build import mypycify  # the `fast` extra; imported here so kvadmit never needs it
    from setuptools import setup

    out = work / "lib"
    config = work / "mypy.ini"
    config.write_text(MYPY_CONFIG, encoding="utf-8")
    paths = ["--config-file", str(config)] + [str(source_path(m)) for m in COMPILED]
    cwd = os.getcwd()
    os.chdir(work)  # mypyc writes its C sources under ./build
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            extensions = mypycify(paths, opt_level="3", multi_file=True)
            setup(
                name="kvadmit-native",
                ext_modules=extensions,
                script_args=[
                    "build_ext",
                    "-j",
                    "2",
                    "--build-lib",
                    str(out),
                    "--build-temp",
                    str(work / "c"),
                ],
            )
    finally:
        os.chdir(cwd)
    return out


def _loads() -> str:
    """The status line a fresh interpreter reports with the new build (it must say compiled)."""
    env = {k: v for k, v in os.environ.items() if k != PURE_ENV}
    code = (
        "import kvadmit.native as n, kvadmit.scheduler.scheduler; print(n.status() if n.active() else 'no')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return lines[-1] if lines else f"exit status {done.returncode}"
    return done.stdout.strip()


def build() -> str | None:
    """Build and install the compiled core; None when it works, else the reason it does not."""
    hashes = source_hashes()  # of the source that is compiled, read before compiling
    log = io.StringIO()
    with tempfile.TemporaryDirectory(prefix="kvadmit-native-") as tmp:
        try:
            out = _compile(Path(tmp), log)
        except ImportError:
            return "mypy is not installed (pip install -e '.[fast]')"
        except (Exception, SystemExit) as exc:  # mypyc's type errors and a failed C compile end here
            saved = Path(tmp).parent / "kvadmit-native-build.log"
            saved.write_text(log.getvalue(), encoding="utf-8")
            return f"the build failed ({type(exc).__name__}; its output: {saved})"
        libraries = sorted(p.name for p in out.glob("*__mypyc*"))
        if len(libraries) != 1:
            return f"the build made {len(libraries)} shared libraries, expected 1"
        shutil.rmtree(BUILD_DIR, ignore_errors=True)
        shutil.copytree(out, BUILD_DIR)
    STAMP.write_text(
        json.dumps({"python": python_tag(), "library": libraries[0], "sources": hashes}, indent=1) + "\n",
        encoding="utf-8",
    )
    loaded = _loads()
    if not loaded.startswith("compiled") and not os.environ.get("KVADMIT_NATIVE_KEEP"):
        shutil.rmtree(BUILD_DIR, ignore_errors=True)
        return f"the build does not load ({loaded})"
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--strict", action="store_true", help="exit 1 when the compiled core cannot be built")
    ap.add_argument("--clean", action="store_true", help="remove the compiled core (back to pure Python)")
    ns = ap.parse_args()
    if ns.clean:
        shutil.rmtree(BUILD_DIR, ignore_errors=True)
        print("kvadmit: compiled core removed; pure Python")
        return 0
    reason = build()
    if reason is None:
        print(f"kvadmit: compiled core built ({len(COMPILED)} modules, {BUILD_DIR})")
        return 0
    print(f"kvadmit: compiled core not built: {reason}; kvadmit runs as pure Python")
    return 1 if ns.strict else 0


if __name__ == "__main__":
    sys.exit(main())
