"""Decode steps replayed from CUDA graphs (on a GPU unless `--disable-cuda-graph`; SGLang's flags).

A small model's decode step on a GPU is bound by launching kernels, not by computing them: 30 layers of a
dozen small kernels each, each launch several microseconds of CPU. A CUDA graph records one forward pass's
kernels once, every input in a buffer that never moves, and replays them with one launch.

A graph's shapes are fixed, so one is captured per (batch size, key length):

* batch sizes as SGLang captures them (cuda_graph_sizes.py); a step runs at the smallest captured size
  that holds its batch, the extra rows padding: token 0 at position 0, written into slot 0 (the pool's
  padding slot, model.new_kv_pool) and attending to it alone;
* key lengths in powers of two up to the context length (cuda_graph_sizes.context_buckets); each sequence's
  slots are padded with slot 0 to the step's bucket and the padding keys masked with −inf, as the eager path
  pads to the batch's longest sequence. (SGLang's attention kernels take lengths as data instead; kvadmit's
  attention on a GPU is PyTorch's, whose shapes follow the keys.)

The graphs of the shortest key length are captured at start-up, largest batch first (SGLang's order: the
memory the largest leaves in the shared pool serves the smaller ones; all write their logits into one
buffer); a longer key length's graphs the first time a step needs one (one log line with the time it
took). A batch larger than the largest captured size runs eagerly.

`capture` is how a forward pass becomes a replayable graph: CudaGraphCapture on a GPU. It is a parameter
so that the buffers and padding around it can be tested where there is no GPU (tests/test_cuda_graph.py
replays by calling the pass again on the same buffers).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

import torch

from kvadmit.model.cuda_graph_sizes import context_buckets, padded_size
from kvadmit.model.forward_batch import ForwardBatch

if TYPE_CHECKING:
    from kvadmit.model.llama import CausalLM

log = logging.getLogger("kvadmit.executor")

Replay = Callable[[], torch.Tensor]  # runs the captured pass again; returns its output buffer


class Capture(Protocol):
    def __call__(self, forward: Replay) -> Replay: ...


class CudaGraphCapture:
    """Records a forward pass as a CUDA graph; every graph shares one memory pool (they never run at the
    same time, and each output is copied out before the next replay)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()
        self.side = torch.cuda.Stream(device)

    def __call__(self, forward: Replay) -> Replay:
        # Warm up on a side stream first, as PyTorch asks (lazy initialisations must not be recorded).
        self.side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.side):
            for _ in range(2):
                forward()
        torch.cuda.current_stream(self.device).wait_stream(self.side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = forward()

        def replay() -> torch.Tensor:
            graph.replay()
            return out

        return replay


class DecodeRow(Protocol):
    """What a decode row gives the graph: its input token, at position end − 1, and its slots kv[:end]."""

    ids: list[int]
    end: int
    slots: list[int]


class GraphDecode:
    def __init__(
        self, model: CausalLM, kv_pool: list[torch.Tensor], sizes: list[int], context_len: int,
        capture: Capture,
    ) -> None:  # fmt: skip
        if not sizes or sizes[0] < 1:
            raise ValueError(f"the captured batch sizes must be at least 1: {sizes}")
        self.model = model
        self.kv_pool = kv_pool
        self.sizes = sizes
        self.max_bs = sizes[-1]
        self.buckets = context_buckets(context_len)
        self.capture = capture
        device = model.device
        self.ids = torch.zeros(self.max_bs, dtype=torch.long, device=device)
        self.positions = torch.zeros(self.max_bs, dtype=torch.long, device=device)
        self.out_slots = torch.zeros(self.max_bs, dtype=torch.long, device=device)
        self.lengths = torch.ones(self.max_bs, dtype=torch.int32, device=device)
        self.last = torch.arange(self.max_bs, device=device)
        # per key length: every row's slots and key mask, [max_bs · L] flat, so that the first bs rows are
        # one contiguous [bs, L] block. Zeros: every key slot 0 and visible, finite while capturing.
        self.key_buffers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.graphs: dict[tuple[int, int], Replay] = {}
        # every graph's logits land in one buffer (allocated by the first warm-up pass, outside any graph):
        # a graph's own output would otherwise stay allocated, [bs, vocab] for each of dozens of graphs
        self.out: torch.Tensor | None = None

    def applies(self, rows: Sequence[DecodeRow]) -> bool:
        return len(rows) <= self.max_bs and max(r.end for r in rows) <= self.buckets[-1]

    def capture_all(self) -> float:
        """Capture every batch size at the shortest key length (start-up); returns the seconds it took."""
        began = time.perf_counter()
        for bs in reversed(self.sizes):
            self._graph(bs, self.buckets[0])
        return time.perf_counter() - began

    def __call__(self, rows: Sequence[DecodeRow]) -> torch.Tensor:
        """[len(rows), vocab] the rows' next-token logits, replayed from the graph that holds them."""
        b = len(rows)
        bs = padded_size(self.sizes, b)
        length = padded_size(self.buckets, max(r.end for r in rows))
        assert bs is not None and length is not None, "a batch the graphs do not hold (check applies())"
        with torch.inference_mode():  # (as the graphs were recorded: their logits buffer is an inference one)
            self._fill(rows, bs, length)
            return self._graph(bs, length)()[:b].clone()

    def _fill(self, rows: Sequence[DecodeRow], bs: int, length: int) -> None:
        b = len(rows)
        pad = [0] * (bs - b)
        ends = [r.end for r in rows]
        self.ids[:bs].copy_(torch.tensor([r.ids[-1] for r in rows] + pad))
        self.positions[:bs].copy_(torch.tensor([e - 1 for e in ends] + pad))
        new_slots = [r.slots[e - 1] for r, e in zip(rows, ends, strict=True)]
        self.out_slots[:bs].copy_(torch.tensor(new_slots + pad))
        lengths = torch.tensor(ends + [1] * (bs - b), dtype=torch.int32)
        self.lengths[:bs].copy_(lengths)
        gather = torch.zeros((bs, length), dtype=torch.long)
        for i, (r, e) in enumerate(zip(rows, ends, strict=True)):
            gather[i, :e] = torch.tensor(r.slots[:e])
        hidden = torch.arange(length)[None, :] >= lengths[:, None]  # padding keys (a padding row keeps key 0)
        bias = torch.zeros((bs, length)).masked_fill_(hidden, float("-inf"))
        slots, mask = self._key_buffers(length)
        slots[: bs * length].copy_(gather.view(-1))
        mask[: bs * length].copy_(bias.view(-1))

    def _key_buffers(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The slots (int64) and key mask (float32) buffers of a key length."""
        if length not in self.key_buffers:
            size, device = self.max_bs * length, self.model.device
            self.key_buffers[length] = (
                torch.zeros(size, dtype=torch.long, device=device),
                torch.zeros(size, device=device),
            )
        return self.key_buffers[length]

    def _graph(self, bs: int, length: int) -> Replay:
        key = (bs, length)
        if key not in self.graphs:
            began = time.perf_counter()
            slots, mask = self._key_buffers(length)
            fb = ForwardBatch(
                self.ids[:bs], self.positions[:bs], self.out_slots[:bs], self.last[:bs],
                slots[: bs * length].view(bs, length), mask[: bs * length].view(1, bs, 1, length), (),
                self.lengths[:bs],
            )  # fmt: skip
            model, kv_pool = self.model, self.kv_pool

            def forward() -> torch.Tensor:
                logits = model.forward_pass(fb, kv_pool)
                if self.out is None:
                    self.out = logits.new_empty((self.max_bs, logits.shape[1]))
                return self.out[:bs].copy_(logits)

            with torch.inference_mode():
                self.graphs[key] = self.capture(forward)
            if length != self.buckets[0]:
                log.info("Captured a decode graph for %d sequences of up to %d tokens in %.2f s", bs, length,
                         time.perf_counter() - began)  # fmt: skip
        return self.graphs[key]
