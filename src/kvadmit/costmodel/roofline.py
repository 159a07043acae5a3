"""Roofline cost models: a GPU's peak bandwidth and FLOPs, a model's shape, stated efficiency factors.

On one GPU of a tensor-parallel group of `tp` (weights, KV heads and FLOPs split `tp` ways):

    decode step  = max( (weight bytes + KV bytes read) / (bandwidth × bw_eff),
                        FLOPs / (peak × decode_eff) )               + all-reduce latency (tp > 1)
        weight bytes = params × bytes per param / tp                 → base_ms
        KV bytes     = KV tokens of the batch × KV bytes per token   → per_kv_token_ms
        FLOPs        = B × decode FLOPs per token / tp               → compute_per_request_ms
                       + KV tokens × attention FLOPs per token / tp  → compute_per_kv_token_ms
    prefill step = N × prefill FLOPs per token / tp / (peak × prefill_eff)   → tokens_per_s
                   (never faster than one read of the weights)               → memory_ms
                   + R × lm_head FLOPs (one row per sequence)                → per_request_ms
                   + all-reduce latency (tp > 1)                             → base_ms

The efficiency factors are assumptions, stated in the model's notes and overridable in the spec:
bw_eff 0.80 (the share of peak HBM bandwidth a decode step's reads reach), decode_eff 0.50 (skinny
GEMMs), prefill_eff 0.60 (the MFU of a large prefill), allreduce_us 10 (two all-reduces per layer).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvadmit.costmodel.costmodel import CostModel, DecodeCost, PrefillCost
from kvadmit.costmodel.shapes import ModelShape


@dataclass(frozen=True, slots=True)
class Gpu:
    name: str
    bytes_per_s: float  # peak HBM bandwidth
    flops: float  # peak dense BF16 tensor FLOPs (no sparsity)
    memory_gb: float


GPUS: dict[str, Gpu] = {
    g.name: g
    for g in (
        Gpu("h100", 3.35e12, 989e12, 80),  # H100 SXM
        Gpu("h200", 4.8e12, 989e12, 141),
        Gpu("a100", 2.04e12, 312e12, 80),  # A100-80GB SXM
        Gpu("rtx4090", 1.008e12, 165.2e12, 24),  # FP32 accumulate; the GPU of logs 03, 04, 07
    )
}
GPU_ALIASES = {"h100-sxm": "h100", "h100sxm": "h100", "a100-80gb": "a100", "a100-sxm": "a100",
               "4090": "rtx4090", "rtx-4090": "rtx4090"}  # fmt: skip


def find_gpu(name: str) -> Gpu | None:
    key = name.strip().lower()
    return GPUS.get(GPU_ALIASES.get(key, key))


@dataclass(frozen=True, slots=True)
class Efficiency:
    bw_eff: float = 0.80
    decode_eff: float = 0.50
    prefill_eff: float = 0.60
    allreduce_us: float = 10.0
    weight_bytes: float = 2.0  # bytes per parameter (BF16)
    kv_bytes: float = 2.0  # bytes per K or V value (BF16)


def roofline(gpu: Gpu, model: ModelShape, tp: int = 1, eff: Efficiency | None = None) -> CostModel:
    e = eff or Efficiency()
    bandwidth = gpu.bytes_per_s * e.bw_eff  # bytes/s actually reached
    weights = model.weight_bytes(e.weight_bytes) / tp
    weights_ms = weights / bandwidth * 1e3
    allreduce_ms = 2 * model.layers * e.allreduce_us / 1e3 if tp > 1 else 0.0
    decode_flops = gpu.flops * e.decode_eff
    prefill_flops = gpu.flops * e.prefill_eff
    decode = DecodeCost(
        base_ms=weights_ms + allreduce_ms,
        per_kv_token_ms=model.kv_bytes_per_token(e.kv_bytes, tp) / bandwidth * 1e3,
        compute_per_request_ms=model.decode_flops_per_token / tp / decode_flops * 1e3,
        compute_per_kv_token_ms=model.attention_flops_per_context_token / tp / decode_flops * 1e3,
    )
    prefill = PrefillCost(
        base_ms=allreduce_ms,
        tokens_per_s=prefill_flops * tp / model.prefill_flops_per_token,
        per_request_ms=2 * model.embedding_params / tp / prefill_flops * 1e3,
        memory_ms=weights_ms,
    )
    name = f"{gpu.name}:{model.name}" + (f":tp={tp}" if tp > 1 else "")
    notes = [
        f"roofline: {gpu.name} {gpu.bytes_per_s / 1e12:g} TB/s, {gpu.flops / 1e12:g} dense BF16 TFLOPS; "
        f"{model.name} {model.params / 1e9:.3f} B params, tp={tp}",
        f"per GPU: weights {weights / 1e9:.2f} GB, KV {model.kv_bytes_per_token(e.kv_bytes, tp):,.0f} "
        f"bytes/token, decode {model.decode_flops_per_token / tp / 1e9:.2f} GFLOP/token, "
        f"prefill {model.prefill_flops_per_token / tp / 1e9:.2f} GFLOP/token",
        f"assumed efficiency: bandwidth {e.bw_eff:g}, decode compute {e.decode_eff:g}, "
        f"prefill compute {e.prefill_eff:g}; all-reduce {e.allreduce_us:g} µs × 2 per layer when tp > 1",
        "left out: attention FLOPs in prefill, kernel launch gaps, CUDA-graph effects, the sampler",
    ]
    return CostModel(decode, prefill, {"name": name, "source": "roofline", "notes": notes})
