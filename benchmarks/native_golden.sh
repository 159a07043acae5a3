#!/usr/bin/env bash
# The compiled core changes nothing but speed: each `kvadmit simulate` configuration below runs once as
# pure Python (KVADMIT_PURE_PYTHON=1) and once compiled (make fast), and the summary, the SGLang log, the
# request trace and the step trace must be byte-identical (cmp). Usage: benchmarks/native_golden.sh [DIR]
set -euo pipefail
out="${1:-$(mktemp -d)}"
py="${PYTHON:-python}"
configs=(
  "overlap|--num-prompts 400 --max-total-tokens 20000 --random-input-len 512 --random-output-len 256"
  "no-overlap|--num-prompts 400 --max-total-tokens 20000 --random-input-len 512 --random-output-len 256 --disable-overlap-schedule"
  "retract-no-overlap|--max-total-tokens 8192 --disable-overlap-schedule --num-prompts 200 --random-input-len 128 --random-output-len 512 --random-range-ratio 0.5 --disable-ignore-eos --request-rate 8"
  "retract-page16|--max-total-tokens 8192 --page-size 16 --num-prompts 300 --random-input-len 128 --random-output-len 512 --random-range-ratio 1 --disable-ignore-eos --max-concurrency 256"
  "mixed-chunk|--num-prompts 300 --max-total-tokens 12000 --enable-mixed-chunk --random-input-len 1024 --random-output-len 128 --request-rate 30"
  "priority|--num-prompts 300 --max-total-tokens 8000 --enable-priority-scheduling --priority-scheduling-preemption-threshold 1 --priority-mix 0:1,5:1,10:1 --random-input-len 300 --random-output-len 300 --request-rate 40"
  "concurrency-eos|--num-prompts 500 --max-total-tokens 30000 --max-concurrency 64 --random-input-len 800 --random-output-len 400 --random-range-ratio 0.2"
  "replicas-rr|--num-prompts 600 --max-total-tokens 10000 --replicas 4 --router round_robin --random-input-len 400 --random-output-len 300 --request-rate 60"
  "replicas-cache|--num-prompts 600 --max-total-tokens 10000 --replicas 3 --router cache_aware --random-input-len 400 --random-output-len 300 --request-rate 60 --disable-overlap-schedule"
)
same=0
for entry in "${configs[@]}"; do
  name="${entry%%|*}"
  read -r -a flags <<<"${entry#*|}"
  for core in pure compiled; do
    d="$out/$name/$core"
    mkdir -p "$d"
    if [ "$core" = pure ]; then export KVADMIT_PURE_PYTHON=1; else unset KVADMIT_PURE_PYTHON; fi
    "$py" -m kvadmit simulate "${flags[@]}" --log-file "$d/log" --trace-requests "$d/requests" \
      --trace-steps "$d/steps" >"$d/summary" 2>"$d/stderr"
  done
  unset KVADMIT_PURE_PYTHON
  ok=1
  for f in summary log requests steps; do
    cmp -s "$out/$name/pure/$f" "$out/$name/compiled/$f" || { ok=0; echo "$name: $f DIFFERS"; }
  done
  if [ "$ok" = 1 ]; then
    same=$((same + 1))
    echo "$name: identical ($(wc -l <"$out/$name/pure/log") log lines, $(grep -c Retract "$out/$name/pure/log" || true) retraction lines, $(wc -l <"$out/$name/pure/steps") steps)"
  fi
done
echo "$same of ${#configs[@]} configurations byte-identical (outputs in $out)"
[ "$same" = "${#configs[@]}" ]
