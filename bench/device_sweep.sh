#!/usr/bin/env bash
# A seed study on a many-core machine: `tunix-ppo-ext sweep --jobs J` with one XLA thread per
# seed, CPU platform. Usage: bash bench/device_sweep.sh JOBS SECONDS [sweep args ...]
# Wheels for what the machine lacks may sit under .whl/ (as for bench/gpu_offload_parity.sh).
# Writes table.md / table.json / curves.png and partial.json (every seed's last state, also
# for seeds cut off by SECONDS) into $OUT (default /tmp/device_sweep).
set -uo pipefail
jobs=$1; seconds=$2; shift 2
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export JAX_PLATFORMS=cpu PYTHONUNBUFFERED=1 WANDB_MODE=disabled
export XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
out=${OUT:-/tmp/device_sweep}; mkdir -p "$out"; dir=/tmp/sweep
nproc; python3 -c "import jax, flax; print('jax', jax.__version__, 'flax', flax.__version__)"
tunix-ppo-ext train --output-dir /tmp/smoke wandb=disabled train.steps=4 \
  >"$out/smoke.log" 2>&1 || { tail -30 "$out/smoke.log"; exit 1; }
timeout "$seconds" tunix-ppo-ext sweep --jobs "$jobs" --output-dir "$dir" "$@" \
  2>"$out/sweep.log"; echo "sweep rc=$?"
cp "$dir"/table.md "$dir"/table.json "$dir"/curves.png "$out"/ 2>/dev/null
python3 - "$dir" "$out/partial.json" <<'PY'
import json, pathlib, sys
rows = {}
for seed in sorted(pathlib.Path(sys.argv[1]).glob("*/seed*")):
  summary = seed / "summary.json"
  lines = (seed / "metrics.jsonl").read_text().splitlines() if (seed / "metrics.jsonl").is_file() else []
  returns = [json.loads(x).get("train/episode_return/mean") for x in lines if x.strip().startswith("{")]
  returns = [r for r in returns if r is not None]
  rows[str(seed.relative_to(sys.argv[1]))] = {
    "summary": json.loads(summary.read_text()) if summary.is_file() else None,
    "batches": len(returns), "last_returns": returns[-30:],
  }
pathlib.Path(sys.argv[2]).write_text(json.dumps(rows, indent=1))
for k, v in rows.items():
  s = v["summary"]
  print(k, v["batches"], s and round(s["final_return"], 3), s and round(s["wall_s"]))
PY
cat "$out/table.md" 2>/dev/null
