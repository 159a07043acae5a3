"""The compiled core: the simulator's hot modules built by mypyc (`make fast`), loaded in place of their
source when the build matches the source, pure Python otherwise. Stdlib only; imported first by kvadmit.

`python -m kvadmit.native_build` (what `make fast` runs) compiles the modules of COMPILED into
src/kvadmit/_native/ (git-ignored), next to a stamp naming the Python it was built for and a hash of each
module's source. When kvadmit is imported, a finder placed ahead of the normal ones loads those modules from
the build, unless:

* KVADMIT_PURE_PYTHON is set to anything but "" or "0" (the mutation checks and any code that monkeypatches
  a compiled module's functions or classes need the Python source: compiled code calls the compiled
  methods directly, so a patch on a compiled class is refused or, worse, accepted and never called);
* there is no build, or it was made for another Python;
* a compiled module's source changed since the build (a stale build is never loaded: `make fast` again).

`status()` says which, in one line (`kvadmit --version`, the simulate log's header).
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

PURE_ENV = "KVADMIT_PURE_PYTHON"
PACKAGE_DIR = Path(__file__).resolve().parent
BUILD_DIR = PACKAGE_DIR / "_native"
STAMP = BUILD_DIR / "stamp.json"

# The hot path of `kvadmit simulate` (cProfile of a 10,000-request run and of a 16-replica fleet,
# docs/sim-speed-profile.md): the scheduler, its memory, the request, the engine loop, the simulated
# executor and client, leaps, the fleet's driver, replicas, router, policies and approximate tree, and
# what they call per request: the cost model and the workload's requests (their frozen dataclasses pickle
# by kvadmit/pickling.py). All fully annotated; the two
# exception classes live in their own modules (errors.py), since a compiled class cannot derive from
# RuntimeError.
COMPILED: tuple[str, ...] = (
    "kvadmit.memory.pool",
    "kvadmit.memory.radix",
    "kvadmit.scheduler.admission",
    "kvadmit.scheduler.batch",
    "kvadmit.scheduler.decode_memory",
    "kvadmit.scheduler.events",
    "kvadmit.scheduler.intake",
    "kvadmit.scheduler.invariants",
    "kvadmit.scheduler.mixed_chunk",
    "kvadmit.scheduler.ordering",
    "kvadmit.scheduler.owed_slots",
    "kvadmit.scheduler.output_budget",
    "kvadmit.scheduler.policy",
    "kvadmit.scheduler.preemption",
    "kvadmit.scheduler.priority",
    "kvadmit.scheduler.ratio",
    "kvadmit.scheduler.results",
    "kvadmit.scheduler.retraction",
    "kvadmit.scheduler.scheduler",
    "kvadmit.scheduler.types",
    "kvadmit.request",
    "kvadmit.sampling_params",
    "kvadmit.engine",
    "kvadmit.executor.simulated",
    "kvadmit.executor.base",
    "kvadmit.sim.client",
    "kvadmit.sim.token_times",
    "kvadmit.sim.leap",
    "kvadmit.fleet.replica",
    "kvadmit.fleet.driver",
    "kvadmit.fleet.router",
    "kvadmit.fleet.policies",
    "kvadmit.fleet.radix",
    "kvadmit.costmodel.costmodel",
    "kvadmit.bench.workload",
)


def source_path(module: str) -> Path:
    """The .py file of a kvadmit module."""
    return PACKAGE_DIR.joinpath(*module.split(".")[1:]).with_suffix(".py")


def source_hashes(modules: Sequence[str] = COMPILED) -> dict[str, str]:
    """sha256 of each module's source: a build is used only while these match its stamp."""
    import hashlib  # here, like json and importlib.util: a process with no build never pays for them

    return {m: hashlib.sha256(source_path(m).read_bytes()).hexdigest() for m in modules}


def python_tag() -> str:
    """The interpreter a build's extension modules load into (their file suffix names it)."""
    return importlib.machinery.EXTENSION_SUFFIXES[0]


class _CompiledFinder:
    """A meta path finder (a find_spec is all one needs; importlib.abc would add 20 ms to every kvadmit
    import): the compiled modules and their shared library, in the build folder, nothing else."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        file = self.files.get(fullname)
        if file is None:
            return None
        import importlib.util

        loader = importlib.machinery.ExtensionFileLoader(fullname, str(file))
        return importlib.util.spec_from_file_location(fullname, file, loader=loader)


_status = "pure Python (not set up)"


def _built_files(stamp: dict[str, object]) -> dict[str, Path]:
    """Module name -> extension file of a build, or {} when one is missing."""
    suffix = python_tag()
    library = str(stamp.get("library", ""))
    files = {library.split(".")[0]: BUILD_DIR / library}
    for module in COMPILED:
        files[module] = BUILD_DIR.joinpath(*module.split(".")).with_name(module.rsplit(".", 1)[1] + suffix)
    return files if all(f.is_file() for f in files.values()) else {}


def _choose() -> tuple[dict[str, Path], str]:
    """The compiled modules to load and the status line."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return {}, f"pure Python ({PURE_ENV}={os.environ[PURE_ENV]})"
    if not STAMP.is_file():
        return {}, "pure Python (no compiled core: make fast builds it)"
    import json

    try:
        stamp = json.loads(STAMP.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}, "pure Python (the compiled core's stamp is unreadable: make fast rebuilds it)"
    if stamp.get("python") != python_tag():
        return {}, f"pure Python (the compiled core was built for {stamp.get('python')}: make fast)"
    if stamp.get("sources") != source_hashes():
        return {}, "pure Python (the compiled core is older than the source: make fast rebuilds it)"
    files = _built_files(stamp)
    if not files:
        return {}, "pure Python (the compiled core is incomplete: make fast rebuilds it)"
    return files, f"compiled core (mypyc, {len(COMPILED)} modules)"


def install() -> None:
    """Put the finder in front when the build is usable; record the status either way. Idempotent."""
    global _status
    if any(isinstance(f, _CompiledFinder) for f in sys.meta_path):
        return
    files, _status = _choose()
    if files:
        sys.meta_path.insert(0, _CompiledFinder(files))


def status() -> str:
    """One line: whether the compiled core is active, and why not when it is not."""
    return _status


def active() -> bool:
    """Whether the scheduler in this process is the compiled one."""
    module = sys.modules.get(COMPILED[0])
    file = getattr(module, "__file__", None) or ""
    return file.endswith(python_tag()) if module is not None else _status.startswith("compiled")
