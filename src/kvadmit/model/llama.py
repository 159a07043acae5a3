"""A decoder-only Llama-family transformer (Llama / SmolLM2, Qwen2, Qwen3) whose KV cache lives in the
token pool: one tensor per layer holding K and V, indexed by the slot ids the scheduler's allocator hands
out.

A forward pass computes the new tokens of several sequences at once (a ragged prefill, or one token each
for decode). Each sequence names the pool slots of all its tokens, in position order; the new tokens are
the last ones. Their K and V are written into their slots first, then the sequences attend over their
slots (forward_batch.py: one batched attention for decode, one call per sequence for prefill). What every
layer shares (RoPE tables, gather indices, masks) is computed once per pass. Parameter names follow
transformers' checkpoints except that q/k/v and gate/up are fused into one matmul each (`fuse_hf_state`
does that at load time).

Written from the architecture's description (RMSNorm, rotary embeddings, grouped-query attention, SwiGLU);
transformers' implementation is used only in the tests, as the reference to compare logits with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from kvadmit.model import decode_ops, kv_quant
from kvadmit.model.forward_batch import ForwardBatch, Sequence, pool_attention
from kvadmit.model.quant import dense_weights_held

__all__ = ["CausalLM", "ForwardBatch", "ModelConfig", "Sequence", "fuse_hf_state"]


@dataclass(frozen=True, slots=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2: biases on q, k, v
    qk_norm: bool = False  # Qwen3: RMSNorm over each head of q and k
    max_position_embeddings: int = 4096

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> ModelConfig:
        """From a transformers config.json (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)."""
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        model_type = str(cfg.get("model_type", "llama"))
        rope_theta = cfg.get("rope_theta")
        if rope_theta is None:  # transformers ≥ 5 nests it in rope_parameters
            rope_theta = (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)
        scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters")
        if scaling is not None and scaling.get("rope_type", scaling.get("type", "default")) == "default":
            scaling = None
        return cls(
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            rope_scaling=scaling,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
            qk_norm=model_type == "qwen3",
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        )


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.compiler.is_compiling():  # a decode step's few float32 rows: one call (decode_ops.c)
            out = decode_ops.rms_norm(x, self.weight, self.eps)
            if out is not None:
                return out
        # Normalised in float32, rounded to the input's dtype, then scaled (as the reference does). Written
        # out: F.rms_norm converts the weight to float32 on every call.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies of the rotary embedding, with Llama 3's frequency-dependent scaling if set, on
    the default device. (Computed on the CPU, then moved: float64 arithmetic on the meta device, where a
    model to be loaded is built, runs Python decompositions that import torch._dynamo, ~70 MB.)"""
    return _rope_inv_freq_cpu(cfg).to(torch.get_default_device())


def _rope_inv_freq_cpu(cfg: ModelConfig) -> torch.Tensor:
    dim = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64, device="cpu") / dim))
    s = cfg.rope_scaling
    if not s:
        return inv.float()
    kind = s.get("rope_type", s.get("type"))
    if kind == "linear":
        return (inv / float(s["factor"])).float()
    if kind == "llama3":
        factor = float(s["factor"])
        low, high = float(s.get("low_freq_factor", 1.0)), float(s.get("high_freq_factor", 4.0))
        old_ctx = float(s["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        # Long wavelengths are slowed by `factor`, short ones kept, the band between blended smoothly.
        smooth = (old_ctx / wavelen - low) / (high - low)
        blended = (1 - smooth) * inv / factor + smooth * inv
        out = torch.where(wavelen > low_wavelen, inv / factor, inv)
        middle = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
        return torch.where(middle, blended, out).float()
    raise ValueError(f"unsupported rope scaling {kind!r}; supported: linear, llama3")


RopeTables = tuple[torch.Tensor, torch.Tensor]  # cos, signed sin: [T, head_dim] each


def rope_tables(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> RopeTables:
    """cos and signed sin [T, dim] of each position, computed once per pass and shared by every layer."""
    freqs = positions.float()[:, None] * inv_freq[None, :]
    cos, sin = freqs.cos(), freqs.sin()
    return torch.cat((cos, cos), dim=-1).to(dtype), torch.cat((-sin, sin), dim=-1).to(dtype)


def apply_rope(x: torch.Tensor, rope: RopeTables) -> torch.Tensor:
    """x [T, heads, dim]. Rotates the two halves of each head (the rotate-half form):
    (x1, x2) → (x1·cos − x2·sin, x2·cos + x1·sin); rolling by half a head swaps the halves."""
    cos, signed_sin = rope
    return x * cos[:, None, :] + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin[:, None, :]


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h, kv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        # q, k and v in one matmul: rows [q heads | k heads | v heads] (fused at load time).
        self.qkv_proj = nn.Linear(cfg.hidden_size, (h + 2 * kv) * d, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=False)
        # the pool rows of K and V heads, [2·kv_heads, 1]: not a buffer, so not counted as weights
        # (tie_and_init_buffers makes it again where the weights are after a meta build). Made on the CPU:
        # arange on the meta device runs a Python decomposition that imports sympy (~30 MB held)
        self.kv_rows = torch.arange(2 * kv, device="cpu")[:, None].to(torch.get_default_device())
        if cfg.qk_norm:
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,  # [T, hidden]
        rope: RopeTables,
        fb: ForwardBatch,
        kv_pool: torch.Tensor,  # [2·kv_heads, pool, dim]
    ) -> torch.Tensor:
        cfg = self.cfg
        h, kv = cfg.num_heads, cfg.num_kv_heads
        qkv = self.qkv_proj(x).view(x.shape[0], h + 2 * kv, cfg.head_dim)
        if cfg.qk_norm:
            qk = torch.cat((self.q_norm(qkv[:, :h]), self.k_norm(qkv[:, h : h + kv])), dim=1)
        else:
            qk = qkv[:, : h + kv]
        qk = apply_rope(qk, rope)
        q, k, v = qk[:, :h], qk[:, h:], qkv[:, h + kv :]
        # The new tokens' K and V go into their slots first, so that they attend to themselves too.
        # One indexed write of both (index_put_: torch.compile updates the pool in place with it); into
        # int8 rows eagerly, one call that quantizes and writes (decode_ops.c).
        new_kv = torch.cat((k, v), dim=1)  # [T, 2·kv_heads, dim]
        eager_int8 = kv_quant.is_int8_rows(kv_pool) and not torch.compiler.is_compiling()
        if not (eager_int8 and decode_ops.kv_store_int8(new_kv, kv_pool, fb.out_slots)):
            rows = kv_quant.to_pool(new_kv.transpose(0, 1), kv_pool)  # [2·kv_heads, T, row]
            kv_pool.index_put_((self.kv_rows, fb.out_slots[None, :]), rows)
        return self.o_proj(pool_attention(q, k, v, kv_pool, fb))


MLP_ROWS = 1024  # rows of activations the MLP takes at once (the default model: 12 MB of float32 per block)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        # gate and up in one matmul: rows [gate | up] (fused at load time).
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > MLP_ROWS:  # a long prefill: its [rows, 2·intermediate] temporaries a block at a time
            # (quantized weights dequantized once for all the blocks)
            with dense_weights_held((self.gate_up_proj, self.down_proj)):
                return torch.cat([self._block(block) for block in x.split(MLP_ROWS)])
        return self._block(x)

    def _block(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self, h: torch.Tensor, rope: RopeTables, fb: ForwardBatch, kv_pool: torch.Tensor
    ) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), rope, fb, kv_pool)
        return h + self.mlp(self.post_attention_layernorm(h))


class _Body(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        # (initialised by hand: nn.Embedding's own init of a meta tensor, when a model is built to be
        # loaded, imports torch._dynamo: ~70 MB of a server that never compiles)
        weight = torch.empty(cfg.vocab_size, cfg.hidden_size)
        if weight.device.type != "meta":
            nn.init.normal_(weight)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, _weight=weight)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


def fuse_hf_state(state: dict[str, torch.Tensor], consume: bool = False) -> dict[str, torch.Tensor]:
    """A transformers state dict with q/k/v and gate/up concatenated into this model's fused
    projections. Layers missing a part are left as they are (loading then names what is missing). With
    `consume`, `state` itself is changed, so that each part is released as soon as it is fused."""
    out = state if consume else dict(state)
    fusions = (("self_attn.", ("q_proj", "k_proj", "v_proj"), "qkv_proj"),
               ("mlp.", ("gate_proj", "up_proj"), "gate_up_proj"))  # fmt: skip
    prefixes = {k[: k.index(".self_attn.") + 1] for k in state if ".self_attn.q_proj." in k}
    prefixes |= {k[: k.index(".mlp.") + 1] for k in state if ".mlp.gate_proj." in k}
    for prefix in prefixes:
        for scope, parts, fused in fusions:
            for kind in ("weight", "bias"):
                names = [f"{prefix}{scope}{p}.{kind}" for p in parts]
                if all(n in out for n in names):
                    out[f"{prefix}{scope}{fused}.{kind}"] = torch.cat([out.pop(n) for n in names])
    return out


class CausalLM(nn.Module):
    """The model. `forward` returns the logits of each sequence's last new token."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = _Body(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)
        self.kv_dtype: torch.dtype | None = None  # the KV pool's dtype when not the model's (quant.py)

    def tie_and_init_buffers(self) -> None:
        """After loading weights into a model built on the meta device: tie lm_head to the embedding
        if the config says so, and compute the RoPE frequencies and the KV rows where the weights are."""
        if self.cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.inv_freq = rope_inv_freq(self.cfg).to(self.device)
        for layer in self.model.layers:
            layer.self_attn.kv_rows = torch.arange(2 * self.cfg.num_kv_heads, device=self.device)[:, None]

    @property
    def device(self) -> torch.device:
        return self.model.norm.weight.device  # (a quantized model's embedding may have no .weight)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype it computes in (the final norm's: a quantized model's embedding may be narrower)."""
        return self.model.norm.weight.dtype

    def weight_bytes(self) -> int:
        """Bytes of weights held in memory (packed copies included, a tied tensor once)."""
        tensors = {id(t): t for t in [*self.parameters(), *self.buffers()] if t is not self.inv_freq}
        return sum(t.numel() * t.element_size() for t in tensors.values())

    def step_read_bytes(self) -> int:
        """Bytes of weights a decode step reads: all but the embedding table (of which it reads a row per
        token), with the output projection counted even when it is the tied embedding."""
        total = 0
        for m in self.modules():
            if m is not self and m is not self.model.embed_tokens:
                own = [*m.parameters(recurse=False), *m.buffers(recurse=False)]  # packed weights are buffers
                total += sum(t.numel() * t.element_size() for t in own)
        return total

    def new_kv_pool(self, size: int, dtype: torch.dtype | None = None) -> list[torch.Tensor]:
        """Per layer, the K and V of a pool of `size` token slots: [2·kv_heads, size, row], K heads first
        (a row: head_dim values, or int8 rows' head_dim + 4 bytes, kv_quant.py)."""
        cfg = self.cfg
        dtype = dtype or self.kv_dtype or self.dtype
        shape = (2 * cfg.num_kv_heads, size, kv_quant.row_width(cfg.head_dim, dtype))
        pools = [torch.empty(shape, dtype=dtype, device=self.device) for _ in range(cfg.num_layers)]
        for pool in pools:
            # A slot is read only after its token's K and V are written, except slot 0, which pads short
            # sequences in a decode batch (masked out, but it must hold finite numbers). Leaving the rest
            # unwritten keeps untouched pages out of resident memory on CPU.
            pool[:, 0].zero_()
        return pools

    def forward(  # type: ignore[override]
        self,
        input_ids: torch.Tensor,  # [T] the new tokens of all sequences, sequence after sequence
        positions: torch.Tensor,  # [T]
        seqs: list[Sequence],
        kv_pool: list[torch.Tensor],
    ) -> torch.Tensor:
        fb = ForwardBatch.build(input_ids, positions, seqs, self.device)
        return self.forward_batch(fb, kv_pool)

    @torch.inference_mode()
    def forward_batch(
        self, fb: ForwardBatch, kv_pool: list[torch.Tensor], all_positions: bool = False
    ) -> torch.Tensor:
        """[B, vocab] logits of each sequence's last new token ([T, vocab], of every new token, with
        all_positions)."""
        return self.forward_pass(fb, kv_pool, all_positions)

    def forward_pass(
        self, fb: ForwardBatch, kv_pool: list[torch.Tensor], all_positions: bool = False
    ) -> torch.Tensor:
        """forward_batch's work, without its inference mode (what model/compiled.py compiles)."""
        h = self.model.embed_tokens(fb.input_ids).to(self.dtype)
        rope = rope_tables(fb.positions, self.inv_freq, h.dtype)
        for layer, pool in zip(self.model.layers, kv_pool, strict=True):
            h = layer(h, rope, fb, pool)
        return self.lm_head(self.model.norm(h if all_positions else h[fb.last]))
