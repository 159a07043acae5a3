"""Dependencies point down (DESIGN.md): the scheduler, capacity, simulator and CLI never import torch."""

from __future__ import annotations

import subprocess
import sys


def test_the_core_imports_without_torch() -> None:
    code = (
        "import sys, kvadmit.cli, kvadmit.scheduler.scheduler, kvadmit.capacity.answer, kvadmit.sim.run, "
        "kvadmit.engine, kvadmit.executor.calibrate, kvadmit.executor.costspec, kvadmit.sim.sweep, "
        "kvadmit.sim.rate_search, kvadmit.sim.replay, kvadmit.commands.costs, kvadmit.commands.sweep, "
        "kvadmit.commands.profile; kvadmit.cli.build_parser(); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"
