"""`--cost-model SPEC`: a JSON file, or a roofline preset `GPU:MODEL[:tp=N][:key=value…]`.

    h100:llama-3-8b            H100 SXM, Llama-3-8B, one GPU
    h200:llama-3-70b:tp=4      four H200s in a tensor-parallel group
    a100:qwen3-8b:bw_eff=0.7   another bandwidth efficiency than the stated 0.80
    cpu-int4:smollm2-135m      measured, not a roofline: the default model's int4 CPU executor as
                               `kvadmit profile` timed it on one machine (costmodel/measured.py)

Keys after the model: tp, bw_eff, decode_eff, prefill_eff, allreduce_us, weight_bytes, kv_bytes
(see costmodel/roofline.py for what each means).
"""

from __future__ import annotations

import os
from dataclasses import fields, replace

from kvadmit.costmodel.costmodel import CostModel, CostModelError
from kvadmit.costmodel.measured import measured_names, measured_preset
from kvadmit.costmodel.roofline import GPUS, Efficiency, find_gpu, roofline
from kvadmit.costmodel.shapes import MODELS, find_model


def preset_names() -> str:
    return f"GPUs {', '.join(GPUS)}; models {', '.join(MODELS)}; measured {measured_names()}"


def resolve_cost_model(spec: str) -> CostModel:
    """A cost model from a file path or a preset spec; CostModelError says what is wrong."""
    if os.path.exists(spec) or spec.endswith(".json") or ":" not in spec:
        return CostModel.from_file(spec)
    return preset(spec)


def preset(spec: str) -> CostModel:
    measured = measured_preset(spec)
    if measured is not None:
        return measured
    gpu_name, model_name, *options = spec.split(":")
    gpu = find_gpu(gpu_name)
    if gpu is None:
        raise CostModelError(f"unknown GPU {gpu_name!r} in cost model {spec!r}; presets: {preset_names()}")
    model = find_model(model_name)
    if model is None:
        raise CostModelError(
            f"unknown model {model_name!r} in cost model {spec!r}; presets: {preset_names()}"
        )
    tp = 1
    eff = Efficiency()
    allowed = {f.name for f in fields(Efficiency)}
    for option in options:
        key, sep, raw = option.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or (key != "tp" and key not in allowed):
            raise CostModelError(
                f"cost model option {option!r} is not key=value with a key among tp, "
                + ", ".join(sorted(allowed))
            )
        try:
            value = float(raw)
        except ValueError:
            raise CostModelError(f"cost model option {key}={raw!r} is not a number") from None
        if key == "tp":
            if value < 1 or value != int(value):
                raise CostModelError(f"tp must be a positive integer, got {raw!r}")
            tp = int(value)
        elif not value > 0 or (key.endswith("_eff") and value > 1):
            raise CostModelError(f"{key} must be > 0{' and ≤ 1' if key.endswith('_eff') else ''}, got {raw}")
        else:
            eff = replace(eff, **{key: value})
    model_cost = roofline(gpu, model, tp, eff)
    # The weights must fit: a preset that cannot hold its own weights is a typo, not a what-if.
    weights_gb = model.weight_bytes(eff.weight_bytes) / tp / 1e9
    if weights_gb > gpu.memory_gb:
        raise CostModelError(
            f"{model.name} needs {weights_gb:.0f} GB of weights per GPU at tp={tp}, more than the "
            f"{gpu.memory_gb:g} GB of a {gpu.name}; raise tp"
        )
    return model_cost
