"""The compiled core (kvadmit/native.py, `make fast`): loaded only when it is built for this Python from
the current source and not turned off, and when loaded it changes nothing but speed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvadmit import native


@pytest.fixture
def build_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """native's build folder moved to an empty temporary one, the pure switch off."""
    monkeypatch.setattr(native, "BUILD_DIR", tmp_path)
    monkeypatch.setattr(native, "STAMP", tmp_path / "stamp.json")
    monkeypatch.delenv(native.PURE_ENV, raising=False)
    return tmp_path


def _stamp(build_dir: Path, **changes: object) -> None:
    stamp = {"python": native.python_tag(), "library": "x__mypyc" + native.python_tag()}
    stamp["sources"] = native.source_hashes()  # type: ignore[assignment]
    stamp.update(changes)  # type: ignore[arg-type]
    (build_dir / "stamp.json").write_text(json.dumps(stamp), encoding="utf-8")


def _touch_extensions(build_dir: Path) -> None:
    suffix = native.python_tag()
    (build_dir / f"x__mypyc{suffix}").touch()
    for module in native.COMPILED:
        path = build_dir.joinpath(*module.split(".")).with_name(module.rsplit(".", 1)[1] + suffix)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()


def test_no_build_is_pure_python(build_dir: Path) -> None:
    assert native._choose() == ({}, "pure Python (no compiled core: make fast builds it)")


def test_a_current_complete_build_is_loaded_module_by_module(build_dir: Path) -> None:
    _stamp(build_dir)
    _touch_extensions(build_dir)
    files, status = native._choose()
    assert status == f"compiled core (mypyc, {len(native.COMPILED)} modules)"
    assert set(files) == {*native.COMPILED, "x__mypyc"}  # every compiled module and their shared library
    assert files["kvadmit.memory.radix"] == build_dir / "kvadmit" / "memory" / f"radix{native.python_tag()}"


def test_the_pure_switch_wins_over_a_good_build(build_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _stamp(build_dir)
    _touch_extensions(build_dir)
    monkeypatch.setenv(native.PURE_ENV, "1")
    assert native._choose() == ({}, "pure Python (KVADMIT_PURE_PYTHON=1)")
    monkeypatch.setenv(native.PURE_ENV, "0")  # "0" and "" do not switch it off
    assert native._choose()[0]


def test_a_build_older_than_the_source_is_never_loaded(build_dir: Path) -> None:
    hashes = native.source_hashes()
    hashes["kvadmit.scheduler.ratio"] = "0" * 64  # one module edited since the build
    _stamp(build_dir, sources=hashes)
    _touch_extensions(build_dir)
    assert native._choose() == (
        {},
        "pure Python (the compiled core is older than the source: make fast rebuilds it)",
    )


def test_a_build_for_another_python_or_missing_a_module_is_not_loaded(build_dir: Path) -> None:
    _stamp(build_dir, python=".cpython-39-x86_64-linux-gnu.so")
    _touch_extensions(build_dir)
    status = "pure Python (the compiled core was built for .cpython-39-x86_64-linux-gnu.so: make fast)"
    assert native._choose() == ({}, status)
    _stamp(build_dir)
    next(build_dir.rglob(f"radix{native.python_tag()}")).unlink()
    assert native._choose() == ({}, "pure Python (the compiled core is incomplete: make fast rebuilds it)")
    (build_dir / "stamp.json").write_text("{not json", encoding="utf-8")
    assert (
        native._choose()[1] == "pure Python (the compiled core's stamp is unreadable: make fast rebuilds it)"
    )


STUB_CHECK = """
from kvadmit.scheduler.decode_memory import DecodeMemory
from kvadmit.scheduler.mixed_chunk import MixedChunk
from kvadmit.scheduler.preemption import PriorityPreemption
from kvadmit.scheduler.scheduler import Scheduler

for mixin in (DecodeMemory, PriorityPreemption, MixedChunk):
    stubs = [n for n, f in vars(mixin).items() if getattr(f, "__code__", None) is not None
             and f.__code__.co_names == ("NotImplementedError",)]
    assert stubs, mixin
    for name in stubs:
        assert getattr(Scheduler, name) is not vars(mixin)[name], (mixin.__name__, name)
        print(mixin.__name__, name, getattr(Scheduler, name).__qualname__)
"""


def test_the_mixins_method_stubs_never_shadow_the_real_methods() -> None:
    """A mixin names a method of the Scheduler or of another mixin as a stub that raises (so that the
    compiled trait calls the real one): in the Scheduler's MRO each name must find the real method.
    (Checked on the Python source, in a process of its own.)"""
    env = {**os.environ, native.PURE_ENV: "1"}
    done = subprocess.run(
        [sys.executable, "-c", STUB_CHECK], capture_output=True, text=True, env=env, check=True
    )
    assert done.stdout.splitlines() == [
        "DecodeMemory _enqueue RequestIntake._enqueue",
        "DecodeMemory _alloc_kv Scheduler._alloc_kv",
        "DecodeMemory _new_running_batch Scheduler._new_running_batch",
        "PriorityPreemption _release DecodeMemory._release",
        "PriorityPreemption _enqueue RequestIntake._enqueue",
        "MixedChunk _drop_finished Scheduler._drop_finished",
        "MixedChunk drop_finishing_in_flight DecodeMemory.drop_finishing_in_flight",
        "MixedChunk alloc_decode_slots DecodeMemory.alloc_decode_slots",
        "MixedChunk _new_running_batch Scheduler._new_running_batch",
    ]


SIMULATE = [
    ["--num-prompts", "150", "--max-total-tokens", "20000", "--random-input-len", "512",
     "--random-output-len", "256", "--enable-mixed-chunk"],
    ["--max-total-tokens", "8192", "--disable-overlap-schedule", "--num-prompts", "200",
     "--random-input-len", "128", "--random-output-len", "512", "--random-range-ratio", "0.5",
     "--disable-ignore-eos", "--request-rate", "8"],  # retracts
    ["--num-prompts", "200", "--max-total-tokens", "10000", "--replicas", "3", "--router", "cache_aware",
     "--random-input-len", "400", "--random-output-len", "300", "--request-rate", "60", "--page-size", "16"],
]  # fmt: skip


def _simulate(flags: list[str], out: Path, pure: bool) -> dict[str, bytes]:
    env = {k: v for k, v in os.environ.items() if k != native.PURE_ENV}
    if pure:
        env[native.PURE_ENV] = "1"
    out.mkdir()
    files = {"log": out / "log", "requests": out / "requests", "steps": out / "steps"}
    command = [sys.executable, "-m", "kvadmit", "simulate", *flags, "--log-file", str(files["log"]),
               "--trace-requests", str(files["requests"]), "--trace-steps", str(files["steps"])]  # fmt: skip
    done = subprocess.run(command, capture_output=True, env=env, check=True)
    version = subprocess.run(
        [sys.executable, "-m", "kvadmit", "--version"], capture_output=True, text=True, env=env
    )
    assert ("compiled core" in version.stdout) is not pure, version.stdout
    return {"summary": done.stdout, **{name: path.read_bytes() for name, path in files.items()}}


@pytest.mark.skipif(
    not native._choose()[0], reason=f"the compiled core is not in use here: {native._choose()[1]}"
)
@pytest.mark.parametrize("flags", SIMULATE, ids=["mixed-chunk", "no-overlap-retract", "replicas-cache-aware"])
def test_compiled_and_pure_simulate_are_byte_identical(flags: list[str], tmp_path: Path) -> None:
    pure = _simulate(flags, tmp_path / "pure", pure=True)
    compiled = _simulate(flags, tmp_path / "compiled", pure=False)
    for name, data in pure.items():
        assert data == compiled[name], name
    assert pure["log"].count(b"\n") > 50 and pure["steps"].count(b"\n") > 500


def test_version_names_the_core_in_one_line() -> None:
    env = {**os.environ, native.PURE_ENV: "1", "COLUMNS": "40"}
    done = subprocess.run(
        [sys.executable, "-m", "kvadmit", "--version"], capture_output=True, text=True, env=env, check=True
    )
    assert done.stdout == "kvadmit 0.1.0: pure Python (KVADMIT_PURE_PYTHON=1)\n"
