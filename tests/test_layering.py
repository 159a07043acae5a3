"""Dependencies point down (DESIGN.md): the scheduler, capacity, simulator, doctor, bench client and CLI
never import torch."""

from __future__ import annotations

import subprocess
import sys


def test_the_core_imports_without_torch() -> None:
    code = (
        "import sys, kvadmit.cli, kvadmit.scheduler.scheduler, kvadmit.capacity.answer, kvadmit.sim.run, "
        "kvadmit.engine, kvadmit.doctor.diagnose, kvadmit.doctor.report, kvadmit.doctor.html, "
        "kvadmit.doctor.watch, kvadmit.bench.run, kvadmit.bench.metrics, kvadmit.costmodel.calibrate, "
        "kvadmit.costmodel.costspec, kvadmit.sim.sweep, kvadmit.sim.rate_search, kvadmit.sim.replay, "
        "kvadmit.cli.flags, kvadmit.cli.capacity, kvadmit.cli.simulate, kvadmit.cli.generate, "
        "kvadmit.cli.serve, kvadmit.cli.doctor, kvadmit.cli.bench, kvadmit.cli.calibrate, "
        "kvadmit.cli.cost_model, kvadmit.cli.sweep, kvadmit.cli.profile, kvadmit.costmodel.profile; "
        "kvadmit.cli.build_parser(); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"


def test_serve_simulate_needs_no_torch(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`kvadmit serve --simulate` stands in for a GPU server on a machine without torch."""
    cost = tmp_path / "cost.json"
    cost.write_text('{"decode": {"base_ms": 1}}')
    code = (
        "import sys\n"
        "from kvadmit.cli import build_parser, server_args_from\n"
        "from kvadmit.server.app import create_app\n"
        "from kvadmit.server.main import build_state\n"
        f"ns = build_parser().parse_args(['serve', '--simulate', {str(cost)!r}, '--enable-metrics'])\n"
        "create_app(build_state(ns, server_args_from(ns)))\n"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_lower_layers_never_import_upper_ones() -> None:
    """Dependencies point down: engine, scheduler, memory and the simulator never import the server."""
    from pathlib import Path

    import kvadmit

    root = Path(kvadmit.__file__).parent
    lower = [*root.glob("scheduler/*.py"), *root.glob("memory/*.py"), *root.glob("sim/*.py")]
    lower.append(root / "engine.py")
    for path in lower:
        text = path.read_text(encoding="utf-8")
        assert "kvadmit.server" not in text and "kvadmit.cli" not in text, path


def test_the_cost_model_sits_below_the_engine_and_executor() -> None:
    """costmodel/ predicts and fits step times: it never builds a model, an executor or an engine."""
    from pathlib import Path

    import kvadmit

    root = Path(kvadmit.__file__).parent
    upper = (
        "kvadmit.engine",
        "kvadmit.executor",
        "kvadmit.model",
        "kvadmit.sim",
        "kvadmit.server",
        "kvadmit.cli",
    )
    for path in root.glob("costmodel/*.py"):
        text = path.read_text(encoding="utf-8")
        assert "import torch" not in text, path
        for name in upper:
            assert name not in text, (path, name)


def test_only_the_entry_point_imports_the_command_line() -> None:
    """cli/ is the top: no module below it imports it (python -m kvadmit runs kvadmit.cli.main)."""
    from pathlib import Path

    import kvadmit

    root = Path(kvadmit.__file__).parent
    for path in root.rglob("*.py"):
        if path.parent.name == "cli" or path == root / "__main__.py":
            continue
        assert "kvadmit.cli" not in path.read_text(encoding="utf-8"), path
