"""Shared fixtures."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from helpers import make_scheduler
from kvadmit.scheduler.scheduler import Scheduler


@pytest.fixture
def mission_scheduler() -> Scheduler:
    """The mission's small pool: --max-total-tokens 4096."""
    return make_scheduler(max_total_tokens=4096, context_len=8192)


@pytest.fixture
def kvadmit_logging_restored() -> Iterator[None]:
    """serve sets up the "kvadmit" logger (handlers on this test's stderr, its level, no propagation): put
    it back as it was, for the tests after this one."""
    logger = logging.getLogger("kvadmit")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    try:
        yield
    finally:
        logger.handlers[:] = saved[0]
        logger.setLevel(saved[1])
        logger.propagate = saved[2]
