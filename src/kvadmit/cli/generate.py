"""`kvadmit generate PROMPT`: one generation offline with the real model (kvadmit.Engine).

The prompt goes through the model's chat template when its tokenizer has one (the default model is an
instruct model: sent bare, it answers with its end-of-sequence token at once); --raw sends it as it is.
A generation that ends before any text says so on stderr, with the token that ended it, and exits 1."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from kvadmit.cli.flags import add_model_flags, model_device
from kvadmit.errors import UsageError

if TYPE_CHECKING:
    from kvadmit.offline import OfflineEngine as Engine

EXIT_ENDED_AT_ONCE = 1

DESCRIPTION = (
    "Generate text for PROMPT with the real model (kvadmit.Engine). The prompt goes through the model's chat "
    "template when its tokenizer has one (--chat, the default), or as it is with --raw. Exit status: 0 with "
    "the text; 1 when the generation ended at once (no text: the reason, and the token that ended it, on "
    "stderr); 2 for bad flags or a model that cannot be loaded."
)


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "generate",
        help="generate text offline with the real model (kvadmit.Engine)",
        description=DESCRIPTION,
    )
    p.add_argument("prompt", help="the prompt text")
    add_model_flags(p)
    template = p.add_mutually_exclusive_group()
    template.add_argument(
        "--chat",
        action="store_true",
        help="wrap the prompt in the model's chat template (the default when its tokenizer has one)",
    )
    template.add_argument(
        "--raw", action="store_true", help="send the prompt as it is, without the chat template"
    )
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--max-total-tokens", type=int, default=16384)
    p.add_argument("--json", action="store_true", help="print text, output ids and meta info as JSON")
    p.set_defaults(func=run)


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def run(ns: argparse.Namespace) -> int:
    from pathlib import Path

    if ns.model_path is not None and not Path(ns.model_path).exists():
        raise UsageError(f"--model-path {ns.model_path!r} does not exist")
    from kvadmit.config import ConfigError
    from kvadmit.model.default import DefaultModelError
    from kvadmit.model.loading import ModelLoadError
    from kvadmit.offline import OfflineEngine as Engine
    from kvadmit.sampling_params import SamplingError

    params = {"max_new_tokens": ns.max_new_tokens, "temperature": ns.temperature, "top_p": ns.top_p,
              "top_k": ns.top_k, "sampling_seed": ns.seed}  # fmt: skip
    try:
        engine = Engine(
            ns.model_path, dtype=ns.dtype, device=model_device(ns), max_total_tokens=ns.max_total_tokens,
            quantization=ns.quantization, kv_cache_dtype=ns.kv_cache_dtype,
        )  # fmt: skip
        templated = _uses_template(engine, ns)
        if templated:
            out = engine.chat([{"role": "user", "content": ns.prompt}], params)
        else:
            out = engine.generate(ns.prompt, params)
    except (ModelLoadError, DefaultModelError, SamplingError, ConfigError) as e:
        raise UsageError(str(e)) from None
    assert isinstance(out, dict)
    print(json.dumps(out) if ns.json else out["text"])
    why = ended_at_once(out, engine, templated=templated) if ns.max_new_tokens > 0 else None
    if why is None:
        return 0
    print(f"kvadmit generate: {why}", file=sys.stderr)
    return EXIT_ENDED_AT_ONCE


def _uses_template(engine: Engine, ns: argparse.Namespace) -> bool:
    """Whether the prompt goes through the chat template: unless --raw, whenever the tokenizer has one."""
    if ns.raw:
        return False
    if has_chat_template(engine.tokenizer):
        return True
    if ns.chat:
        raise UsageError("--chat: the model's tokenizer has no chat template; leave --chat out to send the "
                         "prompt as it is")  # fmt: skip
    return False


def ended_at_once(out: dict[str, Any], engine: Engine, *, templated: bool) -> str | None:
    """Why a generation gave no text at once (None when it gave some, or went on past its first token)."""
    meta = out["meta_info"]
    finish = meta["finish_reason"]
    if out["text"] or meta["completion_tokens"] > 1:
        return None
    if finish["type"] == "abort":
        return f"the request was aborted before its first token: {finish['message']}"
    if finish["type"] != "stop" or not out["output_ids"]:
        return None
    token = out["output_ids"][0]
    shown = engine.tokenizer.convert_ids_to_tokens(token)
    what = "its end-of-sequence token" if token == engine.tokenizer.eos_token_id else "a stop token"
    head = (
        f"the generation ended at once: the model's first token was {token} {shown!r} ({what}), so there "
        "is no text"
    )
    if templated:
        return f"{head}; the prompt went through the model's chat template: --raw sends it as it is"
    if has_chat_template(engine.tokenizer):
        return (f"{head}; the prompt was sent as it is (--raw): an instruct model answers inside its chat "
                "template, which generate applies without --raw")  # fmt: skip
    return f"{head}; the tokenizer has no chat template, so the prompt was sent as it is"
