"""A tiny random Llama saved as a transformers folder (2 layers, hidden 64, vocab 97, 512 positions), its
greedy continuation by transformers itself, and greedy requests for kvadmit's scheduler: the reference the
real executor's tests compare with."""

from __future__ import annotations

from pathlib import Path

import torch

from helpers import make_req
from kvadmit.request import Req
from kvadmit.sampling_params import SamplingParams

CONTEXT = 512


def save_tiny_llama(folder: Path) -> object:
    """The model (transformers' LlamaForCausalLM, float32, eval), saved into `folder`."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=CONTEXT,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(cfg).float().eval()
    model.save_pretrained(folder, safe_serialization=True)
    return model


def greedy(model: object, prompt: list[int], n: int) -> list[int]:
    """transformers' greedy continuation of `prompt`, n tokens."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))  # type: ignore[operator]
    return ids[len(prompt) :]


def greedy_req(rid: str, prompt: list[int], max_new: int, ignore_eos: bool = False) -> Req:
    q = make_req(rid, prompt=prompt, max_new_tokens=max_new, ignore_eos=ignore_eos)
    q.params = SamplingParams(temperature=0.0)
    return q
