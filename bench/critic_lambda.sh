#!/usr/bin/env bash
# Issue 58's actor-lambda study on SmolLM2-135M-Instruct: `guess` 1..10 with 4 turns,
# configs/smollm2_ppo.yaml (turn-level GAE, the critic's lambda 1, 8 critic-only + 64
# updates) with the actor's lambda at 0 and 0.5, and a row with lambda 0.5 and `guess`'s
# information-gain reward (`env.kwargs.info_gain_reward=0.2`: a guess earns 0.2 times the
# share of the still-allowed numbers it rules out; success is still the share of episodes
# that hit). The preset's lambda 0.95 is bench/results/real_model_ppo_recipe (the same
# config, an earlier commit). The two lambda rows are interleaved seed by seed so that an
# interrupted study still has paired seeds; the information-gain row runs after them, then
# GRPO's preset (`configs/smollm2.yaml`, 64 updates, the same baseline batches) with the
# same information-gain reward (a fair comparison of that row), then GRPO's preset on the
# plain game again, so that its advantage noise is measured beside the PPO rows' (the
# earlier GRPO runs predate the metric). Resumable: a rerun skips every finished seed
# (`seed<N>/result.json`) and tunix resumes an unfinished one from its newest checkpoint.
# The untrained baseline batches are the preset's.
#
#   bash bench/critic_lambda.sh [SEEDS...]        # default: 0 1 2
# A fresh clone counts the seeds of the committed `results.json` files as finished (their
# seed directories are not committed): the script trains nothing and prints the committed
# tables. To reproduce the study, run the committed seeds again (real_model.py's --rerun,
# which BENCH_RERUN=1 turns on; a seed with its own seed<N>/result.json here is kept):
#
#   BENCH_RERUN=1 bash bench/critic_lambda.sh [SEEDS...]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=bench/results/critic_lambda
SEEDS=("${@:-0 1 2}")
PPO=(configs/smollm2_ppo.yaml 72)   # the PPO preset: 8 critic-only + 64 updates
GRPO=(configs/smollm2.yaml 64)      # GRPO's preset: 64 updates
run() {  # run CONFIG STEPS ROW KEY=VALUE...: one seed of one row
  local config=$1 steps=$2 row=$3
  shift 3
  "$PY" bench/real_model.py --config "$config" --steps "$steps" \
    --baseline-from bench/results/real_model_ppo_recipe --seed-ids "$seed" \
    --out "$OUT/$row" train.checkpoint_every=8 "$@"
}
for seed in ${SEEDS[@]}; do
  run "${PPO[@]}" guess10_lambda0 ppo.gae_lambda=0
  run "${PPO[@]}" guess10_lambda0.5 ppo.gae_lambda=0.5
done
for seed in ${SEEDS[@]}; do
  run "${PPO[@]}" guess10_lambda0.5_info_gain ppo.gae_lambda=0.5 env.kwargs.info_gain_reward=0.2
done
for seed in ${SEEDS[@]}; do
  run "${GRPO[@]}" guess10_grpo_info_gain env.kwargs.info_gain_reward=0.2
done
for seed in ${SEEDS[@]}; do
  run "${GRPO[@]}" guess10_grpo
done
