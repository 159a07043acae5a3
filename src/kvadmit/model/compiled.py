"""Decode steps through torch.compile (`--enable-torch-compile`, `--torch-compile-max-bs`).

A decode batch of at most `max_bs` sequences runs the whole model (30 layers of small operations at the
default model's size, where Python and the dispatcher cost as much as the matmuls) as one inductor graph:
its norms, rotary embedding, dtype conversions and attention fused into a few C++ loops, the quantized
matmuls left as calls to their kernels. Larger batches and prefills run eagerly, as SGLang falls back above
its max-bs.

Two graphs cover every batch: one sequence (its context length symbolic), and 2..max_bs sequences (batch
size and context length both symbolic, every sequence padded to the longest with a key mask). Both are
compiled at start-up (`warm_up`), so that no request waits for the compiler. Guards on the model's
parameters are skipped (the weights never change while serving), which removes most of the per-call cost.

Unless the environment says otherwise, inductor keeps its cache beside the default model
(~/.cache/kvadmit/torchinductor: the first start on a machine compiles for minutes, later ones read the
cache; its default, /tmp, does not survive a reboot) and compiles in this process (one compile thread: no
pool of worker processes, each importing torch again, so the server's own peak memory shows the compile).
"""

from __future__ import annotations

import gc
import logging
import os
import time
from typing import TYPE_CHECKING

import torch

from kvadmit.model import attention_native
from kvadmit.model.forward_batch import ForwardBatch
from kvadmit.model.heap import return_freed_memory

if TYPE_CHECKING:
    from kvadmit.model.llama import CausalLM

DEFAULT_MAX_BS = 32  # SGLang 0.5.22's --torch-compile-max-bs default
log = logging.getLogger("kvadmit.executor")


def inductor_settings() -> str:
    """Set inductor's cache folder and compile threads where the environment does not (read when inductor
    is first imported, by the first compile); returns the cache folder."""
    from kvadmit.model.default import cache_dir

    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir() / "torchinductor"))
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]


class CompiledDecode:
    def __init__(self, model: CausalLM, max_bs: int = DEFAULT_MAX_BS) -> None:
        if max_bs < 1:
            raise ValueError(f"--torch-compile-max-bs must be at least 1, not {max_bs}")
        self.model = model
        self.max_bs = max_bs
        self.cache = inductor_settings()
        attention_native.available()  # (decided here, eagerly: the graph reads the answer)
        self._graph = torch.compile(
            model.forward_pass,
            options={"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe},
        )

    def applies(self, fb: ForwardBatch) -> bool:
        return fb.gather is not None and fb.num_seqs <= self.max_bs

    def __call__(self, fb: ForwardBatch, kv_pool: list[torch.Tensor]) -> torch.Tensor:
        """[B, vocab] logits of a decode batch that `applies`."""
        b = fb.num_seqs
        if b > 1 and fb.key_bias is None:  # one graph for every batch: the mask always present
            assert fb.gather is not None
            zeros = torch.zeros((1, b, 1, fb.gather.shape[1]), device=fb.gather.device)
            fb = ForwardBatch(
                fb.input_ids, fb.positions, fb.out_slots, fb.last, fb.gather, zeros, (), fb.lengths
            )
        self._mark_dynamic(fb, kv_pool)
        with torch.inference_mode():
            return self._graph(fb, kv_pool)

    def _mark_dynamic(self, fb: ForwardBatch, kv_pool: list[torch.Tensor]) -> None:
        """Batch size and context length symbolic (each was compiled with a sample of 2: sizes 0 and 1 are
        specialised, so a batch of one sequence has its own graph); and the pool's size, so that a server
        whose pool is sized from the memory free at start-up finds the graphs in inductor's cache."""
        assert fb.gather is not None
        for pool in kv_pool:
            torch._dynamo.mark_dynamic(pool, 1)
        torch._dynamo.mark_dynamic(fb.gather, 1)
        if fb.num_seqs > 1:
            for t in (fb.input_ids, fb.positions, fb.out_slots, fb.last, fb.gather, fb.lengths):
                if t is not None:
                    torch._dynamo.mark_dynamic(t, 0)
            assert fb.key_bias is not None
            torch._dynamo.mark_dynamic(fb.key_bias, 1)
            torch._dynamo.mark_dynamic(fb.key_bias, 3)

    def warm_up(self, kv_pool: list[torch.Tensor]) -> None:
        """Compile both graphs now: a batch of one and of two sequences, two tokens of context each, all in
        slot 0 (the padding slot, whose contents only need to stay finite). In inference mode, as the
        executor runs: dynamo guards on it (warmed up outside it, the first real single-sequence batch and
        the first real larger one each compiled a graph again, while serving)."""
        log.info(
            "--enable-torch-compile: compiling the decode graphs (batches of 1 and 2..%d sequences); the "
            "first start on a machine takes minutes, later ones read inductor's cache in %s",
            self.max_bs, self.cache,
        )  # fmt: skip
        began = time.monotonic()
        with torch.inference_mode():
            self._warm_up_batches(kv_pool)
        gc.collect()  # the compiler's garbage, and the heap it freed back to the system: the server then
        return_freed_memory()  # holds ~20-40 MB less (measured in process, default model)
        log.info("--enable-torch-compile: decode graphs ready in %.0f s", time.monotonic() - began)

    def _warm_up_batches(self, kv_pool: list[torch.Tensor]) -> None:
        device = self.model.device
        for b in sorted({1, min(2, self.max_bs)}):
            # distinct tensors for every field, as a real batch has (dynamo guards on aliasing too: one
            # tensor passed twice here would make every real batch compile again)
            ids, positions, slots = (torch.zeros(b, dtype=torch.long, device=device) for _ in range(3))
            gather = torch.zeros((b, 2), dtype=torch.long, device=device)
            key_bias = torch.zeros((1, b, 1, 2), device=device) if b > 1 else None
            lengths = torch.full((b,), 2, dtype=torch.int32, device=device)
            last = torch.arange(b, device=device)
            fb = ForwardBatch(ids, positions + 1, slots, last, gather, key_bias, (), lengths)
            self(fb, kv_pool)
