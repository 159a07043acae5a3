"""The offline API: `kvadmit.OfflineEngine(model_path=None, **server_args).generate(prompts,
sampling_params)`, also known as `kvadmit.Engine` (SGLang's name for its offline engine).

A thin driver on the engine loop (kvadmit.engine.Engine, the one that joins scheduler, executor and
clock): it submits a call's requests, steps the loop until nothing is left to run, and reads each answer
off its Req. The torch executor runs the batches on the real model. Sampling parameters take SGLang's
names and defaults (max_new_tokens 128, temperature 1.0, top_p 1.0, top_k −1, min_p 0, stop,
stop_token_ids, ignore_eos, min_new_tokens, sampling_seed).
"""

from __future__ import annotations

from typing import Any

from kvadmit.config import ServerArgs
from kvadmit.engine import Engine, WallClock
from kvadmit.request import FinishKind, Req, SamplingLimits
from kvadmit.sampling_params import SamplingError, SamplingParams
from kvadmit.scheduler.output_budget import OutputBudgetError, check_requested_max_new_tokens
from kvadmit.scheduler.scheduler import ScheduledBatch, Scheduler
from kvadmit.stop_strings import StopStringWatch, cut_at_stop

_SAMPLING_KEYS = {
    "max_new_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "stop_token_ids", "ignore_eos",
    "min_new_tokens", "sampling_seed", "skip_special_tokens",
}  # fmt: skip


class OfflineEngine:
    def __init__(
        self,
        model_path: str | None = None,
        *,
        dtype: str = "auto",
        device: str | None = None,
        mem_fraction_static: float | None = None,
        quantization: str | None = None,
        kv_cache_dtype: str = "auto",
        **server_args: Any,
    ) -> None:
        """dtype: "auto" (bfloat16 where the CPU or GPU computes it natively, else float32 on a CPU and
        float16 on a GPU), "bfloat16", "float16" or "float32". device: "cuda" when present, else "cpu".
        quantization: None, or int8 / int4 for weight-only quantized weights on the CPU. kv_cache_dtype:
        "auto", "bf16" or "int8" (model/kv_quant.py)."""
        from kvadmit.executor.torch_runner import TorchExecutor
        from kvadmit.model.runtime import load_model

        loaded = load_model(
            model_path,
            dtype=dtype,
            device=device,
            max_total_tokens=server_args.get("max_total_tokens"),
            mem_fraction_static=mem_fraction_static,
            quantization=quantization,
            kv_cache_dtype=kv_cache_dtype,
        )
        self.device = loaded.device
        self.quantization = loaded.quantization
        self.tokenizer = loaded.tokenizer
        self.model = loaded.model
        self.dtype = loaded.dtype
        server_args["max_total_tokens"] = loaded.pool_size
        self.args = ServerArgs(**server_args)
        eos = self.tokenizer.eos_token_id
        self.scheduler = Scheduler(
            self.args,
            context_len=self.model.cfg.max_position_embeddings,
            eos_token_ids=frozenset({eos} if eos is not None else set()),
            stop_checker=self._stop_checker,
        )
        self.executor = TorchExecutor(self.model, self.scheduler.pool.size)
        self.engine = Engine(self.scheduler, self.executor, WallClock(), self)
        self._stops: dict[str, StopStringWatch] = {}  # requests with stop strings, until they end
        self._count = 0
        self._log_startup()

    def _log_startup(self) -> None:
        """SGLang's start-up line, on the `kvadmit` logger."""
        import logging

        from kvadmit.model.sizing import available_bytes
        from kvadmit.observe.startup import startup_info, startup_line

        device = "cuda" if self.device.startswith("cuda") else "cpu"
        line = startup_line(
            startup_info(self.scheduler, self.args, available_bytes(self.device) / 2**30, device)
        )
        self.startup_line = line
        logging.getLogger("kvadmit").info(line)

    # ----- the engine's listener and stop checker -------------------------------------------------
    def on_step(self, batch: ScheduledBatch, now: float) -> None:
        pass  # answers are read off each Req once the loop has run dry

    def on_finish(self, req: Req, now: float) -> None:
        self._stops.pop(req.rid, None)

    def _stop_checker(self, req: Req) -> str | None:
        watch = self._stops.get(req.rid)
        return watch.add(req.output_ids[-1]) if watch is not None else None

    # ----- the API -------------------------------------------------------------------------------
    def generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
    ) -> dict[str, Any] | list[dict[str, Any]]:
        """Generate for one prompt (a dict back) or several (a list back)."""
        single = isinstance(prompt, str) or (
            input_ids is not None and input_ids and isinstance(input_ids[0], int)
        )
        if prompt is not None:
            prompts = [prompt] if isinstance(prompt, str) else list(prompt)
            ids_list = [self.tokenizer.encode(p) for p in prompts]
        elif input_ids is not None:
            ids_list = [list(input_ids)] if single else [list(x) for x in input_ids]  # type: ignore[arg-type]
        else:
            raise ValueError("give a prompt (text) or input_ids")
        params_list = (
            sampling_params if isinstance(sampling_params, list) else [sampling_params or {}] * len(ids_list)
        )
        if len(params_list) != len(ids_list):
            raise ValueError(f"{len(params_list)} sampling_params for {len(ids_list)} prompts")
        reqs = []
        for ids, sp in zip(ids_list, params_list, strict=True):
            req = self._make_req(ids, sp)
            stop = sp.get("stop") or []
            stops = [stop] if isinstance(stop, str) else list(stop)
            if stops:
                self._stops[req.rid] = StopStringWatch(self.tokenizer, stops)
            reqs.append(req)
            self.engine.submit(req)  # a rejection ends it at once (its Req carries the reason)
        while self.engine.step():
            pass
        outputs = [self._output(r) for r in reqs]
        return outputs[0] if single else outputs

    def chat(
        self, messages: list[dict[str, str]], sampling_params: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """One chat turn with the model's chat template."""
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return self.generate(input_ids=list(ids), sampling_params=sampling_params)  # type: ignore[return-value]

    def _make_req(self, ids: list[int], sp: dict[str, Any]) -> Req:
        unknown = set(sp) - _SAMPLING_KEYS
        if unknown:
            raise SamplingError(
                f"unknown sampling parameter(s) {sorted(unknown)}; allowed: {sorted(_SAMPLING_KEYS)}"
            )
        try:
            max_new = check_requested_max_new_tokens(sp.get("max_new_tokens", 128))
        except OutputBudgetError as e:
            raise SamplingError(str(e)) from None
        self._count += 1
        return Req(
            rid=f"offline-{self._count}",
            origin_input_ids=list(ids),  # our own copy: the caller may reuse theirs
            sampling=SamplingLimits(
                requested_max_new_tokens=max_new,
                ignore_eos=bool(sp.get("ignore_eos", False)),
                min_new_tokens=int(sp.get("min_new_tokens", 0)),
                stop_token_ids=frozenset(sp.get("stop_token_ids") or ()),
            ),
            params=SamplingParams(
                temperature=float(sp.get("temperature", 1.0)),
                top_p=float(sp.get("top_p", 1.0)),
                top_k=int(sp.get("top_k", -1)),
                min_p=float(sp.get("min_p", 0.0)),
                seed=sp.get("sampling_seed"),
            ),
        )

    def _output(self, req: Req) -> dict[str, Any]:
        reason = req.finished_reason
        out_ids = list(req.output_ids)
        text = self.tokenizer.decode(out_ids, skip_special_tokens=True)
        if reason is None or reason.kind is FinishKind.ABORT:
            finish: dict[str, Any] = {
                "type": "abort",
                "message": reason.message if reason else "not finished",
            }
        elif reason.kind is FinishKind.LENGTH:
            finish = {"type": "length", "length": len(out_ids)}
        else:
            finish = {"type": "stop", "matched": reason.matched}
            text = cut_at_stop(text, reason.matched)
        return {
            "text": text,
            "output_ids": out_ids,
            "meta_info": {
                "prompt_tokens": len(req.origin_input_ids),
                "completion_tokens": len(out_ids),
                "cached_tokens": req.cached_tokens,
                "finish_reason": finish,
            },
        }
