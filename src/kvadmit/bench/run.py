"""One `kvadmit bench` run, in bench_serving's order: wait for the server, find the model and the
tokenizer, build the prompts, warm up, pause a second, send everything, then print the summary (the same
block `kvadmit simulate` prints) and append the JSON line.

The summary goes to stdout; progress, notes and failures go to stderr. Ctrl-C stops sending, cancels what
is in flight and prints the summary of the requests that finished.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from dataclasses import dataclass, field, replace
from typing import IO, Any

import aiohttp
from tqdm import tqdm

from kvadmit.bench.backends import BACKENDS, PayloadOptions
from kvadmit.bench.client import Exchange, Traffic, describe, new_http_client, send_all, send_one
from kvadmit.bench.datasets import DatasetError, DatasetRow, DatasetSpec, build_dataset
from kvadmit.bench.metrics import calculate_metrics
from kvadmit.bench.output import append_line, details, result_record
from kvadmit.bench.priority_classes import render_priority_classes
from kvadmit.bench.summary import render_summary
from kvadmit.bench.tokenizer import BenchTokenizer, TokenizerError, choose_tokenizer, load_tokenizer
from kvadmit.bench.workload import PriorityMix, draw_priorities
from kvadmit.errors import UsageError

EXIT_FAILED = 1  # the server cannot be reached, the warm-up failed, or no request succeeded
EXIT_INTERRUPTED = 130
WARMUP_MAX_TOKENS = 32
PAUSE_AFTER_WARMUP_S = 1.0  # bench_serving sleeps this long between the warm-up and the run
ERRORS_SHOWN = 3


class BenchError(Exception):
    """The run cannot go on (server unreachable, warm-up failed): one line, exit status 1."""


@dataclass(frozen=True, slots=True)
class BenchConfig:
    backend: str = "sglang"
    base_url: str | None = None
    host: str = "0.0.0.0"
    port: int | None = None
    model: str | None = None
    tokenizer: str | None = None
    dataset: DatasetSpec = field(default_factory=DatasetSpec)
    traffic: Traffic = field(default_factory=Traffic)
    ignore_eos: bool = True
    stream: bool = True
    extra_request_body: dict[str, Any] = field(default_factory=dict)
    warmup_requests: int = 1
    flush_cache: bool = False
    output_file: str | None = None
    output_details: bool = False
    disable_tqdm: bool = False
    ready_check_timeout_s: float = 60.0
    priority_mix: PriorityMix | None = None  # each request sends a priority drawn with these weights

    @property
    def server_url(self) -> str:
        if self.base_url:
            return self.base_url.rstrip("/")
        return f"http://{self.host}:{self.port or BACKENDS[self.backend].default_port}"


def run_bench(cfg: BenchConfig, out: IO[str] | None = None, err: IO[str] | None = None) -> int:
    """Run it; the exit status (0, 1 when no request succeeded, 130 when interrupted)."""
    return asyncio.run(_run(cfg, out or sys.stdout, err or sys.stderr))


async def _fetch(http: aiohttp.ClientSession, method: str, url: str, timeout_s: float) -> tuple[int, Any]:
    """(status, the JSON body or None); transport errors raise."""
    async with http.request(method, url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
        raw = await resp.read()
    try:
        return resp.status, json.loads(raw) if resp.status == 200 and raw else None
    except ValueError:
        return resp.status, None


async def wait_ready(
    http: aiohttp.ClientSession, base: str, timeout_s: float, err: IO[str]
) -> dict[str, Any] | None:
    """Poll /v1/models until the server answers (any status); its model list when it answered 200."""
    deadline = time.monotonic() + timeout_s
    told = False
    while True:
        try:
            _, body = await _fetch(http, "GET", f"{base}/v1/models", 5.0)
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            if time.monotonic() >= deadline:
                waited = f" (waited {timeout_s:g} s)" if timeout_s > 0 else ""
                raise BenchError(f"cannot reach the server at {base}: {_why(e)}{waited}") from None
            if not told and err.isatty():  # a note for people; scripts get the one error line
                print(f"waiting up to {timeout_s:g} s for the server at {base} ...", file=err)
                told = True
            await asyncio.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
            continue
        return body if isinstance(body, dict) else None


def _why(e: BaseException) -> str:
    if isinstance(e, aiohttp.ClientConnectorError):
        if isinstance(e.os_error, ConnectionRefusedError):
            return "connection refused"
        return e.os_error.strerror or describe(e.os_error)
    if isinstance(e, asyncio.TimeoutError):
        return "no answer within 5 s"
    return describe(e)


async def _get_json(http: aiohttp.ClientSession, url: str) -> Any:
    try:
        return (await _fetch(http, "GET", url, 10.0))[1]
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return None


async def _prepare(
    cfg: BenchConfig, http: aiohttp.ClientSession, err: IO[str]
) -> tuple[str, BenchTokenizer, list[DatasetRow], Any]:
    base = cfg.server_url
    models = await wait_ready(http, base, cfg.ready_check_timeout_s, err)
    listed = (models or {}).get("data") or []
    model = cfg.model or (listed[0].get("id") if listed and isinstance(listed[0], dict) else None)
    if model is None and BACKENDS[cfg.backend].api != "native":
        raise UsageError("no model given or listed by /v1/models: pass --model")
    info = await _get_json(http, f"{base}/model_info")
    server_tok = info.get("tokenizer_path") if isinstance(info, dict) else None
    name = choose_tokenizer(cfg.tokenizer, server_tok, model)
    if name is None:
        raise UsageError("no tokenizer: pass --tokenizer (a local folder or tokenizer.json)")
    try:
        tok = await asyncio.to_thread(load_tokenizer, name)
        rows, rng = await asyncio.to_thread(build_dataset, cfg.dataset, tok)
    except (TokenizerError, DatasetError) as e:
        raise UsageError(str(e)) from None
    if not rows:
        raise UsageError("the dataset gave no prompts")
    if BACKENDS[cfg.backend].api == "chat" and not isinstance(rows[0].prompt, str):
        raise UsageError("--tokenize-prompt sends token ids, which the chat backends cannot take")
    return model or "default", tok, rows, rng


async def _run(cfg: BenchConfig, out: IO[str], err: IO[str]) -> int:
    spec = BACKENDS[cfg.backend]
    url = cfg.server_url + spec.path
    async with new_http_client() as http:
        model, tok, rows, rng = await _prepare(cfg, http, err)
        if cfg.priority_mix:
            drawn = draw_priorities(cfg.priority_mix, len(rows), cfg.dataset.seed)
            rows = [replace(row, priority=p) for row, p in zip(rows, drawn, strict=True)]
        opts = PayloadOptions(model, cfg.stream, cfg.ignore_eos, cfg.extra_request_body)
        print(f"#Input tokens: {sum(r.prompt_len for r in rows)}", file=err)
        print(f"#Output tokens: {sum(r.output_len for r in rows)}", file=err)
        if cfg.warmup_requests > 0:
            first = rows[0]
            warm = await asyncio.gather(
                *(send_one(url, spec.api, first, min(first.output_len, WARMUP_MAX_TOKENS), opts)
                  for _ in range(cfg.warmup_requests))
            )  # fmt: skip
            if not any(w.outcome.success for w in warm):
                raise BenchError(f"the warm-up request failed: {warm[0].outcome.error}")
            print(f"Warmup completed with {cfg.warmup_requests} sequences.", file=err)
        if cfg.flush_cache:
            try:
                await _fetch(http, "POST", f"{cfg.server_url}/flush_cache", 30.0)
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                print(f"could not flush the cache: {describe(e)}", file=err)
        await asyncio.sleep(PAUSE_AFTER_WARMUP_S)

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        handled = _on_sigint(loop, stop)
        bar = tqdm(total=len(rows), file=err, disable=cfg.disable_tqdm)
        start = time.perf_counter()
        try:
            results = await send_all(
                url, spec.api, rows, opts, cfg.traffic, rng, lambda _: bar.update(1), stop
            )
        finally:
            duration = time.perf_counter() - start
            bar.close()
            if handled:
                loop.remove_signal_handler(signal.SIGINT)
        server_info = None
        if cfg.output_file and cfg.backend.startswith("sglang"):
            server_info = await _get_json(http, f"{cfg.server_url}/get_server_info")
    return _report(cfg, tok, results, duration, start, server_info, stop.is_set(), out, err)


def _on_sigint(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> bool:
    """The first Ctrl-C sets `stop`; a second one interrupts as usual. False where no handler can be set
    (not the main thread, or no signals on this platform)."""

    def first() -> None:
        stop.set()
        loop.remove_signal_handler(signal.SIGINT)

    try:
        loop.add_signal_handler(signal.SIGINT, first)
    except (NotImplementedError, RuntimeError, ValueError):
        return False
    return True


def _report(
    cfg: BenchConfig,
    tok: BenchTokenizer,
    results: list[Exchange | None],
    duration: float,
    start: float,
    server_info: Any,
    interrupted: bool,
    out: IO[str],
    err: IO[str],
) -> int:
    done = [ex for ex in results if ex is not None]
    outcomes = [ex.outcome for ex in done]
    for ex in done:
        if ex.outcome.success:
            ex.outcome.retokenized_output_len = len(tok.encode(ex.text, add_special_tokens=False))
    m = calculate_metrics(outcomes, duration)
    if interrupted:
        print(f"\ninterrupted: {len(done)} of {len(results)} requests finished; the summary covers them",
              file=err)  # fmt: skip
    failed = [o for o in outcomes if not o.success]
    if failed:
        print(f"{len(failed)} of {len(outcomes)} requests failed; the first errors:", file=err)
        shown: list[str] = []
        for o in failed:
            if o.error not in shown:
                shown.append(o.error)
                print(f"  {o.error}", file=err)
            if len(shown) == ERRORS_SHOWN:
                break
    print(
        render_summary(m, backend=cfg.backend, request_rate=cfg.traffic.request_rate,
                       max_concurrency=cfg.traffic.max_concurrency, duration_s=duration),
        file=out,
    )  # fmt: skip
    by_priority = render_priority_classes(outcomes)
    if by_priority is not None:
        print(by_priority, file=out)
    out.flush()
    if cfg.output_file:
        d = cfg.dataset
        record = result_record(
            m, backend=cfg.backend, dataset_name=d.name, request_rate=cfg.traffic.request_rate,
            max_concurrency=cfg.traffic.max_concurrency, sharegpt_output_len=d.sharegpt_output_len,
            random_input_len=d.input_len, random_output_len=d.output_len,
            random_range_ratio=d.range_ratio, duration_s=duration, server_info=server_info,
        )  # fmt: skip
        if cfg.output_details:
            record |= details(outcomes, [ex.text for ex in done],
                              [o.retokenized_output_len for o in outcomes], start)  # fmt: skip
        try:
            append_line(cfg.output_file, record)
        except OSError as e:
            raise UsageError(f"cannot write {cfg.output_file!r}: {e.strerror}") from None
    if interrupted:
        return EXIT_INTERRUPTED
    return 0 if m.completed else EXIT_FAILED
