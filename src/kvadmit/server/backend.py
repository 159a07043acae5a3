"""What the server runs on: the real model (tokenizer, torch executor, pool sized from memory) or, under
`--simulate COST_MODEL`, a predicted GPU (the simulated executor in real time, a byte-level tokenizer
unless --tokenizer-path is given). Either way the same scheduler decides everything."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvadmit.config import SIMULATED_CONTEXT_LENGTH
from kvadmit.costmodel.costmodel import CostModel
from kvadmit.executor.base import Executor, StepResult
from kvadmit.executor.output_lengths import OutputLengths
from kvadmit.scheduler.types import ScheduledBatch

if TYPE_CHECKING:
    from kvadmit.model.cuda_graph_sizes import GraphFlags

SIMULATED_POOL_DEFAULT = 200_000  # tokens, when --simulate runs without --max-total-tokens


@dataclass
class Backend:
    tokenizer: Any  # encode / decode / apply_chat_template / eos_token_id
    executor: Executor
    pool_size: int
    context_len: int
    eos_token_ids: frozenset[int]
    model_path: str
    tokenizer_path: str
    device: str
    dtype: str
    available_mem_gb: float
    # What the device holds for the weights and the KV pool (sglang:weight_memory_usage_gb and
    # kv_cache_memory_usage_gb); a simulated GPU holds nothing, so 0.
    weight_bytes: int = 0
    kv_cache_bytes: int = 0
    simulated: bool = False
    output_lengths: dict[str, int] = field(default_factory=dict)  # simulated: rid → true output length
    output_distribution: OutputLengths = field(default_factory=lambda: OutputLengths("uniform"))

    def plan_output(self, rid: str, max_new_tokens: int, ignore_eos: bool, seed: int | None) -> None:
        """Simulated requests that may stop early stop at a length drawn from --simulate-output-len's
        distribution, by a generator seeded with the request's seed (or its rid)."""
        if self.simulated and not ignore_eos and max_new_tokens > 0:
            rng = random.Random(seed if seed is not None else rid)
            self.output_lengths[rid] = self.output_distribution.draw(max_new_tokens, rng)

    def keep_logprobs(self, rid: str, top: int) -> None:
        """Keep the log probability of each token this request samples, and of its `top` most likely
        tokens (a real model's executor only)."""
        self.executor.logprob_rids[rid] = top  # type: ignore[attr-defined]

    def logprobs(self, rid: str) -> tuple[list[float], list[list[tuple[float, int]]]]:
        """The log probabilities kept for rid so far, and the top tokens', one per sampled token."""
        return (getattr(self.executor, "logprobs", {}).get(rid, []),
                getattr(self.executor, "top_logprobs", {}).get(rid, []))  # fmt: skip

    def forget(self, rid: str) -> None:
        self.output_lengths.pop(rid, None)
        if not self.simulated:
            self.executor.logprob_rids.pop(rid, None)  # type: ignore[attr-defined]
            self.executor.logprobs.pop(rid, None)  # type: ignore[attr-defined]
            self.executor.top_logprobs.pop(rid, None)  # type: ignore[attr-defined]


class RealTimeSimulatedExecutor:
    """The simulated executor on the wall clock: each step's result is ready its predicted time after
    its launch. The engine waits for it (engine.py: WallClock.wait_until), so under the overlap loop the
    scheduler's own work between steps hides behind the step in flight, as on a GPU."""

    def __init__(self, cost: CostModel, output_lengths: dict[str, int], eos: int, text_token: int) -> None:
        from kvadmit.executor.simulated import TEXT_TOKEN_ID, SimulatedExecutor

        self.inner = SimulatedExecutor(cost, output_lengths, eos_token_id=eos)
        self.sim_text = TEXT_TOKEN_ID
        self.text_token = text_token

    def run(self, batch: ScheduledBatch) -> StepResult:
        result = self.inner.run(batch)
        tokens = [self.text_token if t == self.sim_text else t for t in result.next_token_ids]
        return StepResult(tokens, result.seconds)


def simulated_backend(
    cost_model: str,
    tokenizer_path: str | None,
    max_total_tokens: int | None,
    context_length: int | None,
    output_distribution: OutputLengths | None = None,
) -> Backend:
    from kvadmit.costmodel.costspec import resolve_cost_model
    from kvadmit.model.byte_tokenizer import ByteTokenizer

    cost = resolve_cost_model(cost_model)  # a JSON file or a preset such as h100:llama-3-8b
    if tokenizer_path:
        from kvadmit.model.tokenizer import load_tokenizer

        tokenizer: Any = load_tokenizer(tokenizer_path)
        text_token = tokenizer.encode(" token", add_special_tokens=False)[0]
    else:
        tokenizer = ByteTokenizer()
        text_token = ord("a")
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    lengths: dict[str, int] = {}
    return Backend(
        tokenizer=tokenizer,
        executor=RealTimeSimulatedExecutor(cost, lengths, eos, text_token),
        pool_size=max_total_tokens or SIMULATED_POOL_DEFAULT,
        context_len=context_length or SIMULATED_CONTEXT_LENGTH,
        eos_token_ids=frozenset({eos}),
        model_path=f"simulated:{cost_model}",
        tokenizer_path=tokenizer_path or "byte-level",
        device="simulated",
        dtype="none",
        available_mem_gb=0.0,
        simulated=True,
        output_lengths=lengths,
        output_distribution=output_distribution or OutputLengths("uniform"),
    )


def model_backend(
    model_path: str | None,
    tokenizer_path: str | None,
    dtype: str,
    device: str | None,
    max_total_tokens: int | None,
    mem_fraction_static: float | None,
    context_length: int | None,
    quantization: str | None = None,
    compile_max_bs: int | None = None,
    kv_cache_dtype: str = "auto",
    graphs: GraphFlags | None = None,
) -> Backend:
    """Load the model (the default one when model_path is None) and size the pool; decode batches of up to
    compile_max_bs requests through torch.compile when given; on a GPU, decode steps replayed from CUDA
    graphs unless `graphs` turns them off."""
    from kvadmit.executor.torch_runner import TorchExecutor
    from kvadmit.model.cuda_graph_sizes import GraphFlags
    from kvadmit.model.runtime import load_model

    m = load_model(
        model_path, tokenizer_path=tokenizer_path, dtype=dtype, device=device,
        max_total_tokens=max_total_tokens, mem_fraction_static=mem_fraction_static, quantization=quantization,
        kv_cache_dtype=kv_cache_dtype,
    )  # fmt: skip
    eos = m.tokenizer.eos_token_id
    context_len = context_length or m.model.cfg.max_position_embeddings
    sizes = (graphs or GraphFlags()).capture_sizes(m.model.device.type, _gpu_memory_mib(m.model.device))
    executor = TorchExecutor(
        m.model, m.pool_size, compile_max_bs=compile_max_bs, graph_sizes=sizes, context_len=context_len
    )
    return Backend(
        tokenizer=m.tokenizer,
        executor=executor,
        pool_size=m.pool_size,
        context_len=context_len,
        eos_token_ids=frozenset({eos} if eos is not None else set()),
        model_path=str(model_path or m.folder),
        tokenizer_path=m.tokenizer_path,
        device=m.device,
        dtype=m.dtype,
        available_mem_gb=m.available_bytes / 2**30,
        weight_bytes=m.model.weight_bytes(),
        kv_cache_bytes=sum(t.numel() * t.element_size() for t in executor.kv_pool),
    )


def _gpu_memory_mib(device: Any) -> float | None:
    """The GPU's whole memory in MiB (what SGLang's defaults read); None off a GPU."""
    import torch

    if device.type != "cuda":
        return None
    return float(torch.cuda.get_device_properties(device).total_memory) / 2**20
