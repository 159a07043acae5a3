"""A decoder-only Llama-family transformer (Llama / SmolLM2, Qwen2, Qwen3) whose KV cache lives in the
token pool: one K and one V tensor per layer, indexed by the slot ids the scheduler's allocator hands out.

A forward pass computes the new tokens of several sequences at once (a ragged prefill, or one token each
for decode). Each sequence names the pool slots of all its tokens, in position order; the new tokens are
the last ones. Their K and V are written into their slots first, then each sequence attends over its
slots with a causal mask. Parameter names follow transformers' checkpoints, so a state dict loads as is.

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


@dataclass(frozen=True, slots=True)
class Sequence:
    """One sequence of a forward pass: the pool slots of all its tokens (position order); the last
    `num_new` of them are this pass's tokens."""

    slots: torch.Tensor  # [context] int64
    num_new: int


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies of the rotary embedding, with Llama 3's frequency-dependent scaling if set."""
    dim = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
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


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, dim]; cos/sin [T, dim]. Rotates the two halves of each head (rotate_half form)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h, kv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, h * d, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv * d, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv * d, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,  # [T, hidden]
        cos: torch.Tensor,
        sin: torch.Tensor,
        out_slots: torch.Tensor,  # [T]
        seqs: list[Sequence],
        k_pool: torch.Tensor,  # [pool, kv_heads, dim]
        v_pool: torch.Tensor,
    ) -> torch.Tensor:
        cfg = self.cfg
        t = x.shape[0]
        q = self.q_proj(x).view(t, cfg.num_heads, cfg.head_dim)
        k = self.k_proj(x).view(t, cfg.num_kv_heads, cfg.head_dim)
        v = self.v_proj(x).view(t, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k_pool[out_slots] = k.to(k_pool.dtype)
        v_pool[out_slots] = v.to(v_pool.dtype)
        groups = cfg.num_heads // cfg.num_kv_heads
        outputs = []
        start = 0
        for seq in seqs:
            n = seq.num_new
            ctx = seq.slots.shape[0]
            qs = q[start : start + n].transpose(0, 1)  # [heads, n, dim]
            ks = k_pool[seq.slots].to(q.dtype).repeat_interleave(groups, dim=1).transpose(0, 1)
            vs = v_pool[seq.slots].to(q.dtype).repeat_interleave(groups, dim=1).transpose(0, 1)
            # New token i sits at context position ctx − n + i and sees positions up to it.
            mask = torch.arange(ctx)[None, :] <= (ctx - n + torch.arange(n))[:, None]
            outputs.append(F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask).transpose(0, 1))
            start += n
        out = torch.cat(outputs, dim=0).reshape(t, cfg.num_heads * cfg.head_dim)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class _Body(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


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

    def new_kv_pool(
        self, size: int, dtype: torch.dtype | None = None
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, the K and V tensors of a pool of `size` token slots."""
        cfg = self.cfg
        dtype = dtype or self.lm_head.weight.dtype
        shape = (size, cfg.num_kv_heads, cfg.head_dim)
        return [
            (torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)) for _ in range(cfg.num_layers)
        ]

    @torch.inference_mode()
    def forward(  # type: ignore[override]
        self,
        input_ids: torch.Tensor,  # [T] the new tokens of all sequences, sequence after sequence
        positions: torch.Tensor,  # [T]
        seqs: list[Sequence],
        kv_pool: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        out_slots = torch.cat([s.slots[s.slots.shape[0] - s.num_new :] for s in seqs])
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        h = self.model.embed_tokens(input_ids)
        cos, sin = emb.cos().to(h.dtype), emb.sin().to(h.dtype)
        for layer, (k_pool, v_pool) in zip(self.model.layers, kv_pool, strict=True):
            h = h + layer.self_attn(layer.input_layernorm(h), cos, sin, out_slots, seqs, k_pool, v_pool)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        ends = torch.cumsum(torch.tensor([s.num_new for s in seqs]), 0) - 1
        return self.lm_head(self.model.norm(h[ends]))
