"""Shared fixtures."""

from __future__ import annotations

import pytest

from helpers import make_scheduler
from kvadmit.scheduler.scheduler import Scheduler


@pytest.fixture
def mission_scheduler() -> Scheduler:
    """The mission's small pool: --max-total-tokens 4096."""
    return make_scheduler(max_total_tokens=4096, context_len=8192)
