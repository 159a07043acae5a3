"""Dependencies point down (docs/architecture.md): the scheduler, capacity, simulator, doctor, bench client
and CLI never import torch, and every import between kvadmit's packages follows an arrow of ALLOWED, with no
cycle among them."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import kvadmit

ROOT = Path(kvadmit.__file__).parent

# Package (or top-level module) -> the packages and top-level modules it may import. "kvadmit" is the
# package itself (its __init__: the version, the offline Engine). Arrows within a package are not listed.
ALLOWED: dict[str, str | None] = {
    "cli": None,  # the command line may import anything
    "__main__": "cli",
    "launch_server": "cli",  # python -m kvadmit.launch_server: `kvadmit serve` under SGLang's module name
    "kvadmit": "native offline",
    "native": "",  # the compiled core's loader: stdlib only, imported first
    "native_build": "native",  # make fast
    "offline": "config engine executor model observe request sampling_params scheduler stop_strings",
    "stop_strings": "model",  # the incremental detokenizer it watches
    "server": "kvadmit config costmodel engine errors executor memory model observe request sampling_params "
    "scheduler stop_strings",
    # never the server; the what-ifs run the simulator (sim, costmodel's calibrate, bench's workload)
    "doctor": "bench capacity config costmodel observe scheduler sim",
    # a fleet of simulated replicas behind a router: above the simulator and the engine, below the CLI
    "fleet": "bench config engine executor observe request scheduler sim",
    "sim": "bench config costmodel engine executor observe request scheduler",
    # it talks HTTP: never the server or the simulator (model: the byte tokenizer)
    "bench": "errors model pickling",
    "capacity": "config errors memory native request scheduler",
    "engine": "executor request scheduler",
    "executor": "costmodel model request scheduler",
    "costmodel": "config observe pickling",  # below sim and executor
    "observe": "config scheduler",
    "model": "sampling_params",
    "scheduler": "config memory request",
    "request": "memory sampling_params",
    "memory": "",
    "config": "",
    "errors": "",
    "pickling": "",  # __reduce__ for the compiled core's frozen dataclasses
    "sampling_params": "",
}


def _unit(module: str) -> str:
    """The package or top-level module a dotted kvadmit module belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "kvadmit"


def _imports(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, dotted module) of every kvadmit import in a file: at the top, inside functions and under
    TYPE_CHECKING alike. `from kvadmit import x` names kvadmit.x when x is a module or package."""
    found: list[tuple[int, str]] = []
    package = ".".join(path.relative_to(root.parent).with_suffix("").parts[:-1])
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against the file's package
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                file = root.parent / sub.replace(".", "/")
                is_module = file.with_suffix(".py").exists() or file.is_dir()
                found.append((node.lineno, sub if is_module else base))
    kept = [(line, name) for line, name in found if name == "kvadmit" or name.startswith("kvadmit.")]
    return list(dict.fromkeys(kept))  # `from kvadmit.x import a, b` once


def import_arrows(root: Path = ROOT) -> dict[tuple[str, str], list[str]]:
    """(from unit, to unit) -> 'file:line imports module' for every import between two units."""
    arrows: dict[tuple[str, str], list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).with_suffix("")
        module = ".".join(rel.parts[:-1] if rel.parts[-1] == "__init__" else rel.parts)
        source = _unit(module)
        for line, name in _imports(path, root):
            target = _unit(name)
            if target != source:
                where = f"{path.relative_to(root.parent)}:{line} imports {name}"
                arrows.setdefault((source, target), []).append(where)
    return arrows


def disallowed(arrows: dict[tuple[str, str], list[str]]) -> list[str]:
    out = []
    for (source, target), wheres in sorted(arrows.items()):
        if source not in ALLOWED:
            out.append(f"{source} has no row in ALLOWED: {wheres[0]}")
            continue
        if not _is_allowed(source, target):
            out.extend(f"{source} -> {target} is not allowed: {w}" for w in wheres)
    return out


def cycles(arrows: dict[tuple[str, str], list[str]]) -> list[str]:
    """Every arrow that lies on a cycle between units (the strongly connected components of more than
    one unit, Tarjan's algorithm), named by the file and the import."""
    graph: dict[str, set[str]] = {}
    for source, target in arrows:
        graph.setdefault(source, set()).add(target)
        graph.setdefault(target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.add(top)
                if top == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    out = []
    for component in components:
        members = ", ".join(sorted(component))
        inside = [(arrow, wheres) for arrow, wheres in sorted(arrows.items()) if set(arrow) <= component]
        # The arrows the table does not allow first: they are what closes the cycle.
        inside.sort(key=lambda item: _is_allowed(*item[0]))
        for (source, target), wheres in inside:
            mark = "" if _is_allowed(source, target) else " (not allowed)"
            out.extend(f"cycle among {members}: {source} -> {target}{mark}: {w}" for w in wheres)
    return out


def _is_allowed(source: str, target: str) -> bool:
    allowed = ALLOWED.get(source, "")
    return allowed is None or target in allowed.split()


def test_every_import_follows_an_allowed_arrow() -> None:
    problems = disallowed(import_arrows())
    assert not problems, "\n".join(problems)


def test_no_import_cycle_between_packages() -> None:
    problems = cycles(import_arrows())
    assert not problems, "\n".join(problems)


def test_the_checks_see_a_planted_cycle(tmp_path: Path) -> None:
    """A server import inside a scheduler function, under TYPE_CHECKING in memory: both are found."""
    pkg = tmp_path / "kvadmit"
    for name in ("scheduler", "server", "memory"):
        (pkg / name).mkdir(parents=True)
        (pkg / name / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "scheduler" / "policy.py").write_text("def f():\n    from kvadmit.server import app\n")
    (pkg / "server" / "app.py").write_text("from kvadmit.scheduler.policy import f\n")
    (pkg / "memory" / "pool.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from kvadmit import server\n"
    )
    arrows = import_arrows(pkg)
    assert set(arrows) == {("scheduler", "server"), ("server", "scheduler"), ("memory", "server")}
    found = cycles(arrows)
    assert len(found) == 2 and all("cycle among scheduler, server" in p for p in found)
    assert any("kvadmit/scheduler/policy.py:2 imports kvadmit.server.app" in p for p in found)
    bad = disallowed(arrows)
    assert any(p.startswith("scheduler -> server is not allowed") for p in bad)
    assert any(p.startswith("memory -> server is not allowed: kvadmit/memory/pool.py:3") for p in bad)


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
    """Dependencies point down: engine, scheduler, memory and the simulator never name the server."""
    lower = [*ROOT.glob("scheduler/*.py"), *ROOT.glob("memory/*.py"), *ROOT.glob("sim/*.py")]
    lower.append(ROOT / "engine.py")
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
