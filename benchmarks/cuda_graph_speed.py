"""Decode steps on a GPU: eager (SGLang's --disable-cuda-graph) against replayed from CUDA graphs
(model/cuda_graph.py), the default model's shape (SmolLM2-135M: 30 layers, hidden 576) with random bf16
weights, at several batch sizes and contexts. Prints a table: ms a step each way (CUDA events, the mean
of --steps steps after warm-up), the ratio, and whether every row's greedy token agreed.

On the device machine (python3 there has CUDA PyTorch; nothing to install):
    PYTHONPATH=src KVADMIT_PURE_PYTHON=1 python3 benchmarks/cuda_graph_speed.py
Here, without a GPU, `--device cpu` checks the script's plumbing with graphs 'replayed' by calling the pass
again (no speed meaning).
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable

import torch

from kvadmit.executor.torch_runner import Row, TorchExecutor
from kvadmit.model.cuda_graph_sizes import capture_sizes
from kvadmit.model.llama import CausalLM, ModelConfig

SMOLLM2 = ModelConfig(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9, num_kv_heads=3,
    head_dim=64, rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True,
    max_position_embeddings=8192,
)  # fmt: skip


def eager_replay(forward: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    return forward


def timed(fn: Callable[[], torch.Tensor], steps: int, device: torch.device) -> float:
    """Mean ms of fn() over `steps` calls, after 3 warm-up calls."""
    for _ in range(3):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    began = time.perf_counter()
    for _ in range(steps):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - began) * 1000 / steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--contexts", type=int, nargs="+", default=[256, 2048])
    p.add_argument("--steps", type=int, default=50)
    ns = p.parse_args()
    device = torch.device(ns.device)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = CausalLM(SMOLLM2).to(device=device, dtype=dtype).eval()
    model.tie_and_init_buffers()
    largest = max(ns.batches)
    pool = largest * max(ns.contexts) + 1
    sizes = capture_sizes(largest)
    began = time.perf_counter()
    executor = TorchExecutor(model, pool, graph_sizes=sizes, context_len=SMOLLM2.max_position_embeddings,
                             graph_capture=None if device.type == "cuda" else eager_replay)  # fmt: skip
    graphs = executor.graphs
    assert graphs is not None, "no graphs were captured (see the log)"
    for layer_pool in executor.kv_pool:  # (unwritten slots hold whatever the allocator left: maybe NaN)
        layer_pool.zero_()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    print(f"# benchmarks/cuda_graph_speed.py on {name}, torch {torch.__version__}, {dtype}")
    print(f"captured {len(sizes)} batch sizes (up to {largest}) in {time.perf_counter() - began:.2f} s\n")
    print("| batch | context | eager ms | graph ms | eager / graph | same greedy tokens |")
    print("| ---: | ---: | ---: | ---: | ---: | --- |")
    for context in ns.contexts:
        for b in ns.batches:
            rows = []
            for i in range(b):
                slots = list(range(1 + i * context, 1 + (i + 1) * context))
                rows.append(Row([(7 * i + 3) % SMOLLM2.vocab_size], context - 1, context, slots))

            # (the pool's earlier slots hold whatever a previous row wrote: finite, as attention needs)
            def eager_step(rows: list[Row] = rows) -> torch.Tensor:
                return model.forward_batch(executor.forward_batch(rows), executor.kv_pool)

            def graph_step(rows: list[Row] = rows) -> torch.Tensor:
                return graphs(rows)

            with torch.inference_mode():
                same = bool(torch.equal(eager_step().argmax(-1), graph_step().argmax(-1)))
                eager = timed(eager_step, ns.steps, device)
                replayed = timed(graph_step, ns.steps, device)
            print(f"| {b} | {context} | {eager:.2f} | {replayed:.2f} | {eager / replayed:.2f}× | {same} |")


if __name__ == "__main__":
    main()
