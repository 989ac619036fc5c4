#!/usr/bin/env bash
# Issue 58's studies on SmolLM2-135M-Instruct: where a critic should pay. Each row is
# `bench/real_model.py`, one seed at a time, the rows interleaved seed by seed so that an
# interrupted study still has paired seeds. Resumable: a rerun skips every finished seed
# (`seed<N>/result.json`) and tunix resumes an unfinished one from its newest checkpoint.
#
#   bash bench/critic_pays.sh [SEEDS...]        # default: 0 1 2
# A fresh clone counts the seeds of the committed `results.json` files as finished (their
# seed directories are not committed): the script trains nothing and prints the committed
# tables. To reproduce the study, run the committed seeds again (real_model.py's --rerun,
# which BENCH_RERUN=1 turns on; a seed with its own seed<N>/result.json here is kept):
#
#   BENCH_RERUN=1 bash bench/critic_pays.sh [SEEDS...]
#
# Rows (docs/real_model.md, "Where the critic should pay"):
# - guess32_grpo: `guess` 1..32, 5 turns (random play wins 15%), GRPO's preset (2 secrets x
#   4 samples a batch), 64 updates;
# - guess32_ppo: the same game, PPO's preset with the actor's lambda 0.5 and 8 distinct
#   secrets a batch (1 sample each: no baseline knows the secret), 8 critic-only + 64
#   updates; its baseline batches are GRPO's row's (the same initial policy).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=bench/results/critic_pays
GAME=(env.kwargs.high=32 env.kwargs.max_turns=5 env.max_turns=5 env.max_completion_len=160
  train.checkpoint_every=8)
SEEDS=("${@:-0 1 2}")
for seed in ${SEEDS[@]}; do
  "$PY" bench/real_model.py --config configs/smollm2.yaml --steps 64 --baseline-steps 3 \
    --seed-ids "$seed" --out "$OUT/guess32_grpo" "${GAME[@]}"
  "$PY" bench/real_model.py --config configs/smollm2_ppo.yaml --steps 72 \
    --baseline-from "$OUT/guess32_grpo" --seed-ids "$seed" --out "$OUT/guess32_ppo" \
    "${GAME[@]}" ppo.gae_lambda=0.5 ppo.num_generations=1
done
