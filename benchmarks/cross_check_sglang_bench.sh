#!/usr/bin/env bash
# kvadmit bench against SGLang's own bench_serving (sglang 0.5.9, the newest release whose
# bench_serving imports without torch), both pointed at one `kvadmit serve --simulate` server with the
# same seed, dataset random-ids and the same local tokenizer folder. Each configuration runs twice with
# each tool (in the order A B B A); the table compares counts (must be equal) and timings (must differ
# by no more than the run-to-run spread). Writes benchmarks/cross_check_sglang_bench.txt.
#
#   benchmarks/cross_check_sglang_bench.sh            # about 5 minutes on 2 cores, after the venv exists
#
# Needs: kvadmit's .venv (make setup) and network access to PyPI the first time (the throwaway venv).
# SGLang's code is installed into that venv only; nothing of it is copied here.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
KV=$ROOT/.venv/bin
VENV=${SGLANG_BENCH_VENV:-/tmp/kvadmit-sglang-bench-venv}
OUT=$ROOT/benchmarks/cross_check_sglang_bench.txt
PORT=${PORT:-31991}
WORK=$(mktemp -d /tmp/kvadmit-bench-xcheck.XXXXXX)

# 1. SGLang's bench_serving in a throwaway venv (transformers 5 works, despite sglang's pin on 4.57.1).
if ! "$VENV/bin/python" -c "import sglang.bench_serving" >/dev/null 2>&1; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --no-deps sglang==0.5.9
    "$VENV/bin/pip" install --quiet pybase64 ipython datasets pillow aiohttp numpy tqdm requests transformers
fi

# 2. A local tokenizer folder: the default model's converted folder, or a small BPE trained on the
#    corpus kvadmit ships.
TOK=${TOKENIZER:-$HOME/.cache/kvadmit/SmolLM2-135M-Instruct}
if [ ! -f "$TOK/tokenizer.json" ]; then
    TOK=$WORK/tokenizer
    "$KV/python" - "$TOK" <<'EOF'
import sys
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from kvadmit.bench.datasets import corpus_texts

tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=["<eos>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tok.train_from_iterator(corpus_texts(), trainer)
transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>").save_pretrained(sys.argv[1])
EOF
fi

# 3. The server: a simulated GPU (15 ms decode steps + 0.1 ms a request, 50k prefill tokens/s).
cat > "$WORK/cost.json" <<'EOF'
{"decode": {"base_ms": 15.0, "per_request_ms": 0.1}, "prefill": {"base_ms": 2.0, "tokens_per_s": 50000}}
EOF
SERVE=("$KV/kvadmit" serve --simulate "$WORK/cost.json" --tokenizer-path "$TOK" --port "$PORT")
"${SERVE[@]}" > "$WORK/serve.log" 2>&1 &
SERVER_PID=$!
trap 'kill "$SERVER_PID" 2>/dev/null || true' EXIT
for _ in $(seq 120); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
    sleep 0.5
done
curl -sf "http://127.0.0.1:$PORT/health" >/dev/null || { echo "the server did not start:"; cat "$WORK/serve.log"; exit 1; }

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

# 4. The runs. --flush-cache empties the prefix cache after each warm-up, so no run reuses another's.
COMMON=(--host 127.0.0.1 --port "$PORT" --dataset-name random-ids --num-prompts 128 --random-input-len 256
        --random-output-len 128 --random-range-ratio 0.5 --seed 7 --tokenizer "$TOK" --flush-cache
        --disable-tqdm)
declare -A CONFIGS=(
    [native-c16]="--backend sglang --max-concurrency 16"
    [oai-c16]="--backend sglang-oai --max-concurrency 16"
    [native-rate10]="--backend sglang --request-rate 10"
)
ORDER=(native-c16 oai-c16 native-rate10)
run_tool() {  # TOOL CONFIG RUN
    local tool=$1 name=$2 run=$3 extra
    read -r -a extra <<< "${CONFIGS[$name]}"
    if [ "$tool" = sglang ]; then
        HF_HUB_OFFLINE=1 "$VENV/bin/python" -m sglang.bench_serving "${COMMON[@]}" "${extra[@]}" \
            --output-file "$WORK/$name.sglang.jsonl" > "$WORK/$name.sglang.$run.log" 2>&1
    else
        "$KV/kvadmit" bench "${COMMON[@]}" "${extra[@]}" \
            --output-file "$WORK/$name.kvadmit.jsonl" > "$WORK/$name.kvadmit.$run.log" 2>&1
    fi
    echo "$name $tool run $run done" >&2
}
for name in "${ORDER[@]}"; do  # A B B A, so a slow drift of the shared machine favours neither tool
    run_tool sglang "$name" 1
    run_tool kvadmit "$name" 1
    run_tool kvadmit "$name" 2
    run_tool sglang "$name" 2
done

# 5. The report.
{
    echo "# benchmarks/cross_check_sglang_bench.sh: kvadmit bench vs SGLang 0.5.9 bench_serving"
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "machine: $("$KV/python" -c 'import sys; sys.path.insert(0, "benchmarks"); from machine import cpu_model; print(cpu_model())'), $(nproc) cores; Python $("$KV/python" -c 'import platform; print(platform.python_version())')"
    echo "load average (1, 5, 15 min) before: $LOAD_BEFORE; after: $(cut -d' ' -f1-3 /proc/loadavg) (other jobs share these cores)"
    echo "sglang: $("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("sglang"), "with transformers", m.version("transformers"))')"
    echo "server: kvadmit serve --simulate COST --tokenizer-path $(basename "$TOK") (cost: $(cat "$WORK/cost.json"))"
    echo "both clients: ${COMMON[*]//$TOK/$(basename "$TOK")}"
    for name in "${ORDER[@]}"; do echo "  $name: ${CONFIGS[$name]}"; done
    echo "order: for each config, sglang run 1, kvadmit run 1, kvadmit run 2, sglang run 2"
    echo
    "$KV/python" benchmarks/cross_check_sglang_bench.py "$WORK" "${ORDER[@]}" || true
    echo
    echo "## The last native-c16 summaries, as each tool printed them"
    echo
    echo '```'
    sed -n '/Serving Benchmark Result/,/^==================================================$/p' "$WORK/native-c16.sglang.2.log"
    echo '```'
    echo
    echo '```'
    sed -n '/Serving Benchmark Result/,/^==================================================$/p' "$WORK/native-c16.kvadmit.2.log"
    echo '```'
} > "$OUT"
cat "$OUT"
echo "(raw results in $WORK)" >&2
