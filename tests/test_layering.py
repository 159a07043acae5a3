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
        "kvadmit.commands.costs, kvadmit.commands.sweep, kvadmit.commands.profile; "
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


def test_memory_imports_nothing_of_kvadmit_but_itself() -> None:
    """memory/ sits at the bottom: the cache knows a request only through its own CachedRequest protocol."""
    import ast
    from pathlib import Path

    import kvadmit

    for path in (Path(kvadmit.__file__).parent / "memory").glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                assert not name.startswith("kvadmit") or name.startswith("kvadmit.memory"), (path, name)
