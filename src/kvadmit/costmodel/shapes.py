"""Model shapes for roofline cost models: parameters, weight bytes, KV bytes per token and FLOPs per token,
all derived from the numbers in each model's public config.json (Llama-family decoders: RMSNorm, GQA,
SwiGLU MLP; Qwen3 adds a per-head RMSNorm on q and k).

Parameter count of one layer:
    attention  hidden × heads × head_dim (q) + 2 × hidden × kv_heads × head_dim (k, v)
               + heads × head_dim × hidden (o)
    MLP        3 × hidden × intermediate (gate, up, down)
    norms      2 × hidden (+ 2 × head_dim for Qwen3's q/k norms)
plus the embedding (vocab × hidden), the final norm, and a separate lm_head unless the embedding is tied.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ModelShape:
    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool
    qk_norm: bool = False

    @property
    def layer_matmul_params(self) -> int:
        """Weights of one layer's matrix multiplications (what a token's forward pass multiplies by)."""
        h, d = self.hidden, self.head_dim
        attention = h * self.heads * d + 2 * h * self.kv_heads * d + self.heads * d * h
        return attention + 3 * h * self.intermediate

    @property
    def layer_params(self) -> int:
        return self.layer_matmul_params + 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0)

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def non_embedding_params(self) -> int:
        """What model cards call non-embedding parameters: the layers and the final norm."""
        return self.layers * self.layer_params + self.hidden

    @property
    def params(self) -> int:
        head = 0 if self.tied_embeddings else self.embedding_params
        return self.non_embedding_params + self.embedding_params + head

    def weight_bytes(self, bytes_per_param: float = 2.0) -> float:
        return self.params * bytes_per_param

    def kv_bytes_per_token(self, bytes_per_value: float = 2.0, tp: int = 1) -> float:
        """K and V of every layer, on one GPU of a tensor-parallel group: KV heads are split across
        the GPUs, and replicated when there are fewer of them than GPUs."""
        heads_here = max(self.kv_heads // tp, 1)
        return 2 * self.layers * heads_here * self.head_dim * bytes_per_value

    @property
    def prefill_flops_per_token(self) -> int:
        """2 FLOPs per multiply-add over the layers' weights. The lm_head runs only on each sequence's
        last token in a prefill, and attention's own FLOPs (4 × layers × heads × head_dim per earlier
        token) are left out: a few percent for prompts of a few thousand tokens."""
        return 2 * self.layers * self.layer_matmul_params

    @property
    def decode_flops_per_token(self) -> int:
        """A decode token goes through every layer and the lm_head (vocab × hidden)."""
        return self.prefill_flops_per_token + 2 * self.embedding_params

    @property
    def attention_flops_per_context_token(self) -> int:
        """Per new token and per earlier token it attends to: q·k and the weighted sum of v."""
        return 4 * self.layers * self.heads * self.head_dim


MODELS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        # meta-llama/Meta-Llama-3-8B and -70B (config.json)
        ModelShape("llama-3-8b", 4096, 14336, 32, 32, 8, 128, 128256, tied_embeddings=False),
        ModelShape("llama-3-70b", 8192, 28672, 80, 64, 8, 128, 128256, tied_embeddings=False),
        # Qwen/Qwen3-*: head_dim 128 everywhere; the small ones tie the embedding (config.json)
        ModelShape("qwen3-0.6b", 1024, 3072, 28, 16, 8, 128, 151936, tied_embeddings=True, qk_norm=True),
        ModelShape("qwen3-4b", 2560, 9728, 36, 32, 8, 128, 151936, tied_embeddings=True, qk_norm=True),
        ModelShape("qwen3-8b", 4096, 12288, 36, 32, 8, 128, 151936, tied_embeddings=False, qk_norm=True),
        ModelShape("qwen3-32b", 5120, 25600, 64, 64, 8, 128, 151936, tied_embeddings=False, qk_norm=True),
        # HuggingFaceTB/SmolLM2-135M (the default model): 9 heads of 64, 3 KV heads
        ModelShape("smollm2-135m", 576, 1536, 30, 9, 3, 64, 49152, tied_embeddings=True),
    )
}

ALIASES = {
    "meta-llama-3-8b": "llama-3-8b",
    "llama3-8b": "llama-3-8b",
    "llama-3.1-8b": "llama-3-8b",
    "meta-llama-3-70b": "llama-3-70b",
    "llama3-70b": "llama-3-70b",
    "llama-3.1-70b": "llama-3-70b",
    "smollm2": "smollm2-135m",
    "smollm2-135m-instruct": "smollm2-135m",
}


def find_model(name: str) -> ModelShape | None:
    """A preset by name, case-insensitive; an organisation prefix ("Qwen/") and "-instruct" are ignored."""
    key = name.strip().lower().rsplit("/", 1)[-1]
    key = ALIASES.get(key, key)
    if key.endswith("-instruct") and key not in MODELS:
        key = ALIASES.get(key[: -len("-instruct")], key[: -len("-instruct")])
    return MODELS.get(key)
