"""vLLM's log lines that speak about the same things (running, waiting, KV usage, preemption), defined
with the same `LineFormat` machinery as SGLang's, so one lenient reader handles both.

* V0 (`metrics.py`): `Avg prompt throughput: …, Running: N reqs, Swapped: N reqs, Pending: N reqs,
  GPU KV cache usage: x%, CPU KV cache usage: y%.`
* V1 (`loggers.py`): `…, Running: N reqs, Waiting: N reqs, GPU KV cache usage: x%, Prefix cache hit rate: y%`
* V0's preemption warning, printed once per 50 preemptions, with the cumulative count.
"""

from __future__ import annotations

from kvadmit.observe.loglines import FieldReader, LineFormat

STATUS_V0 = LineFormat(
    "vllm_status_v0",
    "Avg prompt throughput: {prompt_throughput:.1f} tokens/s, "
    "Avg generation throughput: {gen_throughput:.1f} tokens/s, Running: {running_req} reqs, "
    "Swapped: {swapped_req} reqs, Pending: {queue_req} reqs, GPU KV cache usage: {gpu_usage_pct:.1f}%, "
    "CPU KV cache usage: {cpu_usage_pct:.1f}%.",
)
STATUS_V1 = LineFormat(
    "vllm_status_v1",
    "Avg prompt throughput: {prompt_throughput:.1f} tokens/s, "
    "Avg generation throughput: {gen_throughput:.1f} tokens/s, Running: {running_req} reqs, "
    "Waiting: {queue_req} reqs, GPU KV cache usage: {gpu_usage_pct:.1f}%, "
    "Prefix cache hit rate: {prefix_hit_pct:.1f}%",
)
STATUS_HEAD = "Avg prompt throughput:"
PREEMPT = LineFormat(
    "vllm_preempt",
    "Sequence group {seq_group} is preempted by PreemptionMode.{mode} mode because there is not enough "
    "KV cache space. This can affect the end-to-end performance. Increase gpu_memory_utilization or "
    "tensor_parallel_size to provide more KV cache memory. total_num_cumulative_preemption={cumulative}",
    {"seq_group": (r"\S+", str), "mode": (r"\w+", str)},
)
PREEMPT_HEAD = "is preempted by PreemptionMode."
# vLLM V0 warns on the 1st, 51st, 101st … preemption: one warning stands for 50.
PREEMPTIONS_PER_WARNING = 50

STATUS_READER = FieldReader((STATUS_V0, STATUS_V1))
