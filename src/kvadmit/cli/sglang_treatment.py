"""What `kvadmit serve` does with each of SGLang's launch flags (the list: sglang_flags_0_5_22.json).

Every flag of the list is in exactly one of three tables, by its argparse dest:

* IMPLEMENTED: kvadmit has the flag and does what SGLang does with it.
* REFUSED: kvadmit does not model what the flag changes, and it would change the scheduler's decisions. The
  values in `allowed` (SGLang's default, and any value that means what kvadmit does) are accepted with no
  effect; any other value is one line and exit status 2, with the reason.
* Every other flag parses and has no effect on this engine (logging, kernels, networking, tuning of a
  feature that a REFUSED flag turns on, ...): `kvadmit serve` names those it was given once in the
  start-up log.

tests/test_sglang_flags.py checks that the tables cover the list exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

# SGLang's dest → the kvadmit flag that does the same
IMPLEMENTED: dict[str, str] = {
    "model_path": "--model-path",
    "tokenizer_path": "--tokenizer-path",
    "context_length": "--context-length",
    "dtype": "--dtype",
    "quantization": "--quantization",
    "kv_cache_dtype": "--kv-cache-dtype",
    "mem_fraction_static": "--mem-fraction-static",
    "max_running_requests": "--max-running-requests",
    "max_queued_requests": "--max-queued-requests",
    "max_total_tokens": "--max-total-tokens",
    "chunked_prefill_size": "--chunked-prefill-size",
    "max_prefill_tokens": "--max-prefill-tokens",
    "prefill_max_requests": "--prefill-max-requests",
    "schedule_policy": "--schedule-policy",
    "schedule_conservativeness": "--schedule-conservativeness",
    "page_size": "--page-size",
    "disable_radix_cache": "--disable-radix-cache",
    "device": "--device",
    "random_seed": "--random-seed",
    "watchdog_timeout": "--watchdog-timeout",
    "host": "--host",
    "port": "--port",
    "api_key": "--api-key",
    "served_model_name": "--served-model-name",
    "log_level": "--log-level",
    "enable_metrics": "--enable-metrics",
    "decode_log_interval": "--decode-log-interval",
    "stream_interval": "--stream-interval",
    "disable_overlap_schedule": "--disable-overlap-schedule",
    "enable_mixed_chunk": "--enable-mixed-chunk",
    "enable_torch_compile": "--enable-torch-compile",
    "torch_compile_max_bs": "--torch-compile-max-bs",
    "disable_cuda_graph": "--disable-cuda-graph",
    "disable_decode_cuda_graph": "--disable-decode-cuda-graph",
    "cuda_graph_max_bs_decode": "--cuda-graph-max-bs-decode",
    "cuda_graph_bs_decode": "--cuda-graph-bs-decode",
    "disable_cuda_graph_padding": "--disable-cuda-graph-padding",
    "config": "--config",
    # priority scheduling (scheduler/priority.py)
    "enable_priority_scheduling": "--enable-priority-scheduling",
    "schedule_low_priority_values_first": "--schedule-low-priority-values-first",
    "default_priority_value": "--default-priority-value",
    "abort_on_priority_when_disabled": "--abort-on-priority-when-disabled",
    "disable_priority_preemption": "--disable-priority-preemption",
    "priority_scheduling_preemption_threshold": "--priority-scheduling-preemption-threshold",
    "retraction_policy": "--retraction-policy",
}

# --schedule-policy: SGLang 0.5.22's choices kvadmit does not model (its own: config.SCHEDULE_POLICIES).
# 'priority' is a choice of SGLang's parser that its scheduler then rejects ("Unknown schedule_policy");
# priority scheduling is --enable-priority-scheduling.
UNMODELLED_SCHEDULE_POLICIES = ("dfs-weight", "priority", "routing-key", "hrrn", "shortest-prefill-first")


@dataclass(frozen=True)
class Refusal:
    allowed: tuple[object, ...]  # values accepted (with no effect): SGLang's default and its equivalents
    reason: str  # why another value is refused: what kvadmit does not model


_ONE_DEVICE = "kvadmit runs one scheduler on one device: no tensor, pipeline, data or context parallelism"
_SPEC = "kvadmit does not model speculative decoding (its admission reserves draft tokens)"
_PD = "kvadmit does not model prefill/decode or encoder disaggregation"
_HYBRID = "kvadmit models one full-attention KV pool, not hybrid SWA or mamba pools"
_CACHE = "kvadmit models the GPU radix cache with LRU eviction, not host, storage or external caches"
_LORA = "kvadmit does not model LoRA adapters (SGLang's admission limits adapters per batch)"
_DELAY = "kvadmit admits as soon as the budget allows; it does not model prefill delays"
_NONE: tuple[object, ...] = (None,)
_OFF: tuple[object, ...] = (False, None)

REFUSED: dict[str, Refusal] = {
    # parallelism: more than one scheduler, or a pool and request cap divided between ranks
    "tp_size": Refusal((1,), _ONE_DEVICE),
    "pp_size": Refusal((1,), _ONE_DEVICE),
    "dp_size": Refusal((1,), _ONE_DEVICE),
    "attn_dp_size": Refusal((1,), _ONE_DEVICE),
    "attn_cp_size": Refusal((1,), _ONE_DEVICE),
    "dcp_size": Refusal((1,), _ONE_DEVICE),
    "enable_dp_attention": Refusal(_OFF, _ONE_DEVICE),
    # speculative decoding
    "speculative_algorithm": Refusal(_NONE, _SPEC),
    "speculative_draft_model_path": Refusal(_NONE, _SPEC),
    "enable_multi_layer_eagle": Refusal(_OFF, _SPEC),
    "decoupled_spec_role": Refusal(("null",), _SPEC),
    # disaggregation
    "disaggregation_mode": Refusal(("null",), _PD),
    "encoder_only": Refusal(_OFF, _PD),
    "language_only": Refusal(_OFF, _PD),
    "enable_pdmux": Refusal(_OFF, _PD),
    "enable_pd_role_switch": Refusal(_OFF, _PD),
    # pools other than one full-attention pool
    "swa_full_tokens_ratio": Refusal(_NONE, _HYBRID),
    "max_mamba_cache_size": Refusal(_NONE, _HYBRID),
    "mamba_full_memory_ratio": Refusal(_NONE, _HYBRID),
    "is_embedding": Refusal(_OFF, "kvadmit serves generation, not embeddings"),
    "prefill_only_disable_kv_cache": Refusal(_OFF, "kvadmit serves generation, not embeddings"),
    "dllm_algorithm": Refusal(_NONE, "kvadmit does not model diffusion language models"),
    # the event loop and the admission order
    "num_continuous_decode_steps": Refusal((1,), "kvadmit schedules before every decode step"),
    "scheduler_recv_interval": Refusal((1,), "kvadmit's scheduler takes new requests before every step"),
    "prefill_decode_interval": Refusal((None, 0), _DELAY),
    "enable_prefill_delayer": Refusal(_OFF, _DELAY),
    "prefill_delayer_queue_min_ratio": Refusal(_NONE, _DELAY),
    "min_free_slots_delay": Refusal((None, 1), _DELAY),
    "allow_auto_truncate": Refusal(
        _OFF, "kvadmit rejects a prompt longer than the context (SGLang's default)"
    ),
    "skip_tokenizer_init": Refusal(_OFF, "kvadmit tokenizes requests itself"),
    # caches other than the GPU radix cache with LRU eviction
    "radix_eviction_policy": Refusal(("lru",), _CACHE),
    "radix_eviction_policy_config": Refusal(_NONE, _CACHE),
    "radix_cache_backend": Refusal(_NONE, _CACHE),
    "enable_hierarchical_cache": Refusal(_OFF, _CACHE),
    "enable_lmcache": Refusal(_OFF, _CACHE),
    "enable_flexkv": Refusal(_OFF, _CACHE),
    "enable_hisparse": Refusal(_OFF, _CACHE),
    "enable_unified_cache_external_linker": Refusal(_OFF, _CACHE),
    "enable_session_radix_cache": Refusal(_OFF, _CACHE),
    # LoRA
    "enable_lora": Refusal(_OFF, _LORA),
    "lora_paths": Refusal((None, []), _LORA),
}
