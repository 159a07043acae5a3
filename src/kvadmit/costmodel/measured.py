"""Measured presets: cost models that `kvadmit profile` measured on a named machine, shipped in the package
(costmodel/data/) and named like a roofline preset, HARDWARE:MODEL:

    cpu-int4-kv8:smollm2-135m       the default model with int4 weights and an int8 KV cache on the CPU
                                    executor, decoding eagerly (`make serve`'s default: --quantization int4
                                    --kv-cache-dtype int8)
    cpu-int4:smollm2-135m           the same with the bf16 KV cache (`--quantization int4`)
    cpu-int4-compiled:smollm2-135m  int4 with compiled decode (`--quantization int4 --enable-torch-compile`),
                                    the mean of two profile runs

Each file has a `.log` next to it: the command, the machine, the date, its load and the profile's own
measurements as it printed them. A measured preset takes no options: it is what was measured, nothing
else (another CPU runs `kvadmit profile` itself).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from importlib import resources

from kvadmit.costmodel.costmodel import CostModel, CostModelError
from kvadmit.costmodel.shapes import find_model


@dataclass(frozen=True, slots=True)
class MeasuredPreset:
    hardware: str
    model: str  # a key of shapes.MODELS, so its names are as forgiving as a roofline preset's
    file: str  # under costmodel/data/
    what: str  # for `kvadmit cost-model --list`

    @property
    def name(self) -> str:
        return f"{self.hardware}:{self.model}"


MEASURED: tuple[MeasuredPreset, ...] = (
    MeasuredPreset(
        "cpu-int4-kv8",
        "smollm2-135m",
        "cpu-int4-kv8_smollm2-135m.json",
        "kvadmit profile --quantization int4 --kv-cache-dtype int8 of SmolLM2-135M-Instruct (make serve's "
        "default: eager decode, kvadmit's CPU kernels, an int8 KV cache), on 2 AMD EPYC cores (AVX-512 BF16 "
        "and VNNI, no AMX), 2026-12-02",
    ),
    MeasuredPreset(
        "cpu-int4",
        "smollm2-135m",
        "cpu-int4_smollm2-135m.json",
        "kvadmit profile --quantization int4 of SmolLM2-135M-Instruct (eager decode, kvadmit's CPU "
        "kernels), on 2 AMD EPYC cores (AVX-512 BF16 and VNNI, no AMX), 2026-12-02",
    ),
    MeasuredPreset(
        "cpu-int4-compiled",
        "smollm2-135m",
        "cpu-int4-compiled_smollm2-135m.json",
        "kvadmit profile --quantization int4 --enable-torch-compile of SmolLM2-135M-Instruct (compiled "
        "decode, kvadmit's CPU kernels), the mean of two runs on 2 AMD EPYC cores (AVX-512 BF16 and VNNI, "
        "no AMX), 2026-12-02",
    ),
)
MEASURED_HARDWARE = frozenset(p.hardware for p in MEASURED)


def measured_names() -> str:
    return ", ".join(p.name for p in MEASURED)


def measured_preset(spec: str) -> CostModel | None:
    """The measured preset `spec` names, or None when its hardware is no measured preset's (a GPU
    roofline then); CostModelError for a measured hardware with another model or with options."""
    hardware, model_name, *options = spec.split(":")
    hardware = hardware.strip().lower()
    if hardware not in MEASURED_HARDWARE:
        return None
    shape = find_model(model_name)
    found = [p for p in MEASURED if p.hardware == hardware and shape is not None and p.model == shape.name]
    if not found:
        raise CostModelError(
            f"no measured preset for model {model_name!r} on {hardware} in cost model {spec!r}; measured "
            f"presets: {measured_names()} (run kvadmit profile on this machine for another)"
        )
    if options:
        raise CostModelError(
            f"cost model {spec!r}: the measured preset {found[0].name} takes no options "
            f"({', '.join(options)}); write it with kvadmit cost-model {found[0].name} -o FILE to edit it"
        )
    return load(found[0])


def load(preset: MeasuredPreset) -> CostModel:
    text = resources.files("kvadmit.costmodel").joinpath("data", preset.file).read_text(encoding="utf-8")
    cost = CostModel.from_dict(json.loads(text))
    return replace(cost, meta={**cost.meta, "name": preset.name})
