"""The offline API: `kvadmit.Engine(model_path=None, **server_args).generate(prompts, sampling_params)`.

The same scheduler decides everything; the torch executor runs its batches on the real model. Sampling
parameters take SGLang's names and defaults (max_new_tokens 128, temperature 1.0, top_p 1.0, top_k −1,
min_p 0, stop, stop_token_ids, ignore_eos, min_new_tokens, sampling_seed).
"""

from __future__ import annotations

from typing import Any

from kvadmit.config import ServerArgs
from kvadmit.request import FinishKind, Req, SamplingLimits
from kvadmit.sampling_params import SamplingError, SamplingParams
from kvadmit.scheduler.events import RequestAborted
from kvadmit.scheduler.scheduler import Scheduler

_SAMPLING_KEYS = {
    "max_new_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "stop_token_ids", "ignore_eos",
    "min_new_tokens", "sampling_seed", "skip_special_tokens",
}  # fmt: skip


class Engine:
    def __init__(
        self,
        model_path: str | None = None,
        *,
        dtype: str = "auto",
        device: str | None = None,
        mem_fraction_static: float | None = None,
        **server_args: Any,
    ) -> None:
        """dtype: "auto" (bfloat16 where the CPU or GPU computes it natively, else float32 on a CPU and
        float16 on a GPU), "bfloat16", "float16" or "float32". device: "cuda" when present, else "cpu"."""
        from kvadmit.executor.torch_runner import TorchExecutor
        from kvadmit.model.runtime import load_model

        loaded = load_model(
            model_path,
            dtype=dtype,
            device=device,
            max_total_tokens=server_args.get("max_total_tokens"),
            mem_fraction_static=mem_fraction_static,
        )
        self.device = loaded.device
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
        self._stops: dict[str, tuple[list[str], Any]] = {}
        self._count = 0
        self._log_startup()

    def _log_startup(self) -> None:
        """SGLang's start-up line, on the `kvadmit` logger."""
        import logging

        from kvadmit.model.sizing import available_bytes
        from kvadmit.observe import loglines

        s = self.scheduler
        line = loglines.STARTUP.render(
            max_total_num_tokens=s.max_total_num_tokens,
            chunked_prefill_size=self.args.chunked_prefill_size or s.chunked_prefill_size or -1,
            max_prefill_tokens=self.args.max_prefill_tokens,
            max_running_requests=s.max_running_requests,
            context_len=s.context_len,
            mem_label="available_gpu_mem" if self.device.startswith("cuda") else "available_cpu_mem",
            available_mem=available_bytes(self.device) / 2**30,
        )
        self.startup_line = line
        logging.getLogger("kvadmit").info(line)

    # ----- stop strings --------------------------------------------------------------------------
    def _stop_checker(self, req: Req) -> str | None:
        stops, detok = self._stops.get(req.rid, ((), None))
        if not stops or detok is None:
            return None
        detok.add([req.output_ids[-1]])
        for stop in stops:
            if stop in detok.text:
                return stop
        return None

    # ----- the API -------------------------------------------------------------------------------
    def generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
    ) -> dict[str, Any] | list[dict[str, Any]]:
        """Generate for one prompt (a dict back) or several (a list back)."""
        from kvadmit.model.detokenize import IncrementalDetokenizer

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
            stops = sp.get("stop") or []
            self._stops[req.rid] = (
                [stops] if isinstance(stops, str) else list(stops),
                IncrementalDetokenizer(self.tokenizer),
            )
            reqs.append(req)
            self.scheduler.add_request(req)
        self._run()
        outputs = [self._output(r) for r in reqs]
        for r in reqs:
            self._stops.pop(r.rid, None)
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
        max_new = sp.get("max_new_tokens", 128)
        if max_new is not None and (not isinstance(max_new, int) or max_new < 0):
            raise SamplingError(f"max_new_tokens must be an integer ≥ 0, got {max_new!r}")
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

    def _run(self) -> None:
        sched = self.scheduler
        while True:
            batch = sched.next_batch()
            sched.drain_events()
            if batch is None:
                return
            sched.on_batch_done(batch, self.executor.run(batch).next_token_ids)
            for event in sched.drain_events():
                if isinstance(event, RequestAborted):
                    continue  # its Req carries the reason

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
            if isinstance(reason.matched, str):
                text = text[: text.find(reason.matched)] if reason.matched in text else text
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
