"""The real executor: runs the scheduler's batches through the PyTorch model, its KV in the token pool.

A prefill computes each request's tokens fill_ids()[prefix_len:fill_len] into slots kv[prefix_len:
fill_len], attending to everything before them; a decode computes each request's last output token into
slot kv[-1]. Either way the request's slots, in position order, are exactly kv[:end]. Each request's
next token is drawn with its own sampling parameters (greedy ones by argmax, all in one call). For the
requests named in logprob_rids, each sampled token's log probability is kept, with the most likely
tokens' when asked (see token_logprob).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from kvadmit.executor.base import StepResult
from kvadmit.executor.prefill_passes import PASS_TOKENS, Piece, split_passes
from kvadmit.model.compiled import CompiledDecode
from kvadmit.model.cuda_graph import Capture, CudaGraphCapture, GraphDecode
from kvadmit.model.forward_batch import ForwardBatch, Sequence
from kvadmit.model.heap import return_freed_memory
from kvadmit.model.llama import CausalLM
from kvadmit.model.sampling import Sampler, token_logprob
from kvadmit.scheduler.types import ScheduledBatch

log = logging.getLogger("kvadmit.executor")


@dataclass(frozen=True, slots=True)
class Row:
    """One request's part of a batch: the ids of its new tokens at positions [begin, end), and its pool
    slots kv[:end] in position order."""

    ids: list[int]
    begin: int
    end: int
    slots: list[int]


class TorchExecutor:
    def __init__(
        self, model: CausalLM, pool_size: int, dtype: torch.dtype | None = None, seed: int = 0,
        compile_max_bs: int | None = None, graph_sizes: list[int] | None = None,
        context_len: int | None = None, graph_capture: Capture | None = None,
    ) -> None:  # fmt: skip
        """compile_max_bs: decode batches of up to that many requests through torch.compile (compiled now,
        model/compiled.py); None: all eager. If compiling fails, every batch runs eagerly (one log line).
        graph_sizes: decode batches replayed from graphs captured now at these batch sizes, for contexts up to
        context_len (model/cuda_graph.py; `graph_capture` records them, a CUDA graph by default)."""
        self.model = model
        self.kv_pool = model.new_kv_pool(pool_size, dtype)
        self.pass_tokens = PASS_TOKENS  # a prefill batch's new tokens per forward pass, at most
        self.compiled: CompiledDecode | None = None
        if compile_max_bs is not None:
            self.compiled = CompiledDecode(model, compile_max_bs)
            try:
                self.compiled.warm_up(self.kv_pool)
            except Exception as e:  # a model or torch build inductor cannot compile: serve eagerly
                self._give_up_compiling("in warm-up", e)
        self.graphs: GraphDecode | None = None
        if graph_sizes is not None:
            self._capture_graphs(graph_sizes, context_len or model.cfg.max_position_embeddings, graph_capture)
        self.sampler = Sampler(seed)
        # the requests whose tokens' log probabilities are kept: rid → how many top tokens' too
        self.logprob_rids: dict[str, int] = {}
        self.logprobs: dict[str, list[float]] = {}  # rid → one per sampled token, in order
        self.top_logprobs: dict[str, list[list[tuple[float, int]]]] = {}  # rid → one list per sampled token

    def _give_up_compiling(self, when: str, e: Exception) -> None:
        log.warning("--enable-torch-compile: compiling failed %s (%s: %s); decoding eagerly instead", when,
                    type(e).__name__, _first_line(e))  # fmt: skip
        self.compiled = None

    def _capture_graphs(self, sizes: list[int], context_len: int, capture: Capture | None) -> None:
        """SGLang's two start-up lines around the capture (its format, with this device's memory)."""
        from kvadmit.model.sizing import available_bytes

        device = self.model.device
        label = f"{device.type.upper()} graph"  # (SGLang's "CUDA graph", "CPU graph")
        before = available_bytes(str(device)) / 2**30
        log.info("Capture target decode %s begin. backend=full, num_tokens_per_req=1, avail mem=%.2f GB",
                 label, before)  # fmt: skip
        try:
            self.graphs = GraphDecode(self.model, self.kv_pool, sizes, context_len,
                                      capture or CudaGraphCapture(device))  # fmt: skip
            seconds = self.graphs.capture_all()
        except Exception as e:  # a model or device a graph cannot record: decode eagerly
            log.warning("Capture %s failed (%s: %s); decoding eagerly instead (--disable-cuda-graph says so "
                        "up front)", label, type(e).__name__, _first_line(e))  # fmt: skip
            self.graphs = None
            return
        after = available_bytes(str(device)) / 2**30
        log.info("Capture target decode %s end. bs=%s, elapsed=%.2f s, mem usage=%.2f GB, avail mem=%.2f GB.",
                 label, sizes, seconds, before - after, after)  # fmt: skip

    def rows(self, batch: ScheduledBatch) -> list[Row]:
        """Each request's part of a scheduled batch: its new tokens, their positions and its slots."""
        rows: list[Row] = []
        decoding = set(map(id, batch.decoding or ()))  # mixed chunk: decode rows in a prefill batch
        for i, req in enumerate(batch.reqs):
            kv = req.kv
            if batch.kind == "prefill" and id(req) not in decoding:
                begin, end = req.prefix_len, req.fill_len
                ids = req.fill_ids()[begin:end]
            else:
                if batch.kvs is not None:
                    kv = batch.kvs[i]  # (a request that ended under the overlap loop gave req.kv away)
                end = len(kv)  # the last output token's slot was just allocated
                begin = end - 1
                ids = [req.output_ids[-1]]
            rows.append(Row(ids, begin, end, kv[:end]))
        return rows

    def forward_batch(self, rows: list[Row], pieces: list[Piece] | None = None) -> ForwardBatch:
        """The model's input for the rows of a batch (or for `pieces` of them: prefill_passes.py)."""
        if pieces is None:
            pieces = [Piece(i, row.begin, row.end, True) for i, row in enumerate(rows)]
        ids: list[int] = []
        positions: list[int] = []
        seqs: list[Sequence] = []
        for p in pieces:
            row = rows[p.row]
            ids += row.ids[p.begin - row.begin : p.end - row.begin]
            positions += range(p.begin, p.end)
            seqs.append(Sequence(torch.tensor(row.slots[: p.end]), p.end - p.begin))
        return ForwardBatch.build(torch.tensor(ids), torch.tensor(positions), seqs, self.model.device)

    def logits(self, batch: ScheduledBatch) -> tuple[torch.Tensor, bool]:
        """[B, vocab] each request's next-token logits: a prefill of more than pass_tokens new tokens in
        several passes, a decode batch that fits replayed from a graph or run through the compiled graphs,
        else one eager pass; and whether a graph ran it (the log lines' "cuda graph: True")."""
        rows = self.rows(batch)
        if batch.kind == "prefill" and sum(r.end - r.begin for r in rows) > self.pass_tokens:
            out = []
            for pieces in split_passes([(r.begin, r.end) for r in rows], self.pass_tokens):
                logits = self.model.forward_batch(self.forward_batch(rows, pieces), self.kv_pool)
                out.append(logits[[i for i, p in enumerate(pieces) if p.last]])
            return torch.cat(out), False
        if batch.kind == "decode" and self.graphs is not None and self.graphs.applies(rows):
            return self.graphs(rows), True
        fb = self.forward_batch(rows)
        if self.compiled is not None and self.compiled.applies(fb):
            try:
                return self.compiled(fb, self.kv_pool), True
            except Exception as e:  # a recompilation that fails: this batch (its K and V rewritten) and
                self._give_up_compiling("on a batch", e)  # every later one run eagerly
        return self.model.forward_batch(fb, self.kv_pool), False

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> StepResult:
        start = time.perf_counter()
        logits, graph = self.logits(batch)
        logits = logits.float()  # exact; and argmax over bf16 is slow on CPU
        if batch.kind == "prefill" and self.model.device.type == "cpu":
            return_freed_memory()  # its activations' heap pages (model/heap.py)
        tokens = logits.argmax(dim=-1).tolist()  # the step's one device-to-host sync
        for i, req in enumerate(batch.reqs):
            if not req.params.greedy:  # drawn on the CPU, where the per-request generators live
                tokens[i] = self.sampler.sample(req.rid, logits[i].cpu(), req.params)
        if self.logprob_rids:
            for i, req in enumerate(batch.reqs):
                if req.rid in self.logprob_rids and req is not batch.chunked:  # (a chunk's token is dropped)
                    top = self.logprob_rids[req.rid]
                    lp, best = token_logprob(logits[i], tokens[i], req.params, top)
                    self.logprobs.setdefault(req.rid, []).append(lp)
                    if top:
                        self.top_logprobs.setdefault(req.rid, []).append(best)
        return StepResult(tokens, time.perf_counter() - start, graph=graph)


def _first_line(e: Exception) -> str:
    """An exception's message for a one-line warning: its first line, at most 200 characters."""
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else ""
