"""What every route needs: the engine runner, the tokenizer, names and settings."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from starlette.concurrency import run_in_threadpool

from kvadmit.observe.load_snapshot import LoadCounters
from kvadmit.server.errors import APIError
from kvadmit.server.protocol import check_lengths
from kvadmit.server.runner import EngineRunner


@dataclass
class ServerState:
    runner: EngineRunner
    served_model_name: str
    server_args: dict[str, Any]  # the resolved arguments, for /server_info
    api_key: str | None = None
    enable_metrics: bool = False
    health_timeout: float = 20.0
    created: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    load: LoadCounters = field(default_factory=LoadCounters)  # attached to the engine by build_state
    accelerator: str | None = None  # the GPU's name (SGLang's get_device_name); None on CPU and simulated
    # what SGLang's scheduler reports at start-up: status, pool size, max_req_input_len, startup_time
    scheduler_info: dict[str, Any] = field(default_factory=dict)

    @property
    def tokenizer(self) -> Any:
        return self.runner.backend.tokenizer

    @property
    def context_len(self) -> int:
        return self.runner.scheduler.context_len

    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(
            await run_in_threadpool(self.tokenizer.encode, text, add_special_tokens=add_special_tokens)
        )

    def check_lengths(self, input_len: int, max_new: int | None, field: str) -> None:
        s = self.runner.scheduler
        check_lengths(
            input_len, max_new, context_len=s.context_len, pool=s.max_total_num_tokens, page=s.page_size,
            field=field,
        )  # fmt: skip

    def check_accepting(self) -> None:
        if not self.runner.accepting:
            raise APIError("The server is shutting down.", 503)

    async def engine_call(self, fn: Any) -> Any:
        return await asyncio.wrap_future(self.runner.call(fn))
