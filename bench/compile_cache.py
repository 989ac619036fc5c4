"""The persistent compilation cache of `train`: a cold run against a warm one, side by side.

Runs `tunix-ppo-ext train` (the console command, each run a fresh process) `--repeats`
times per pair: first with an empty cache root (`TUNIX_PPO_EXT_CACHE` a new directory:
every program compiles and is written), then again on the same root (every program is
read back), each into its own output directory, same config and seed. It prints, per run,
the first step's time (`timing_s/step` at step 1 in `metrics.jsonl`: compilation plus one
step) and the whole command's wall time, then the medians and the warm/cold ratios.

  python bench/compile_cache.py [--config configs/smollm2.yaml] [--repeats 1] [KEY=VALUE ...]
  python bench/compile_cache.py --config ""   # the embedded default run (the toy model)

Default overrides: `train.steps=2`, no evaluation or checkpoint past the end; extra
`KEY=VALUE`s follow them. A user's `JAX_COMPILATION_CACHE_DIR` and
`JAX_ENABLE_COMPILATION_CACHE` are removed from the runs' environment (they would win).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

OVERRIDES = ["train.steps=2", "train.eval_every=1000", "train.checkpoint_every=1000"]


def run(config: str, out: pathlib.Path, cache: pathlib.Path, extra: list[str]) -> dict:
  """One `train` command: its first step's seconds and its wall seconds."""
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
  env.pop("JAX_ENABLE_COMPILATION_CACHE", None)
  env["TUNIX_PPO_EXT_CACHE"] = str(cache)
  train = pathlib.Path(sys.executable).with_name("tunix-ppo-ext")
  chosen = ["--config", config] if config else []  # none: the embedded default run
  command = [str(train), "train", *chosen, f"output_dir={out}", *OVERRIDES, *extra]
  start = time.perf_counter()
  done = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  wall = time.perf_counter() - start
  if done.returncode:
    raise RuntimeError(f"train failed ({done.returncode}):\n{done.stderr.decode()[-3000:]}")
  rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
  first = next(r["timing_s/step"] for r in rows if r.get("step") == 1 and "timing_s/step" in r)
  return {"first_step": first, "wall": wall}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="configs/smollm2.yaml")
  parser.add_argument("--repeats", type=int, default=1)
  parser.add_argument("overrides", nargs="*")
  args = parser.parse_args()
  results: dict[str, list[dict]] = {"cold": [], "warm": []}
  with tempfile.TemporaryDirectory() as tmp:
    for repeat in range(args.repeats):
      cache = pathlib.Path(tmp) / f"cache{repeat}"
      for kind in ("cold", "warm"):
        out = pathlib.Path(tmp) / f"{kind}{repeat}"
        result = run(args.config, out, cache, args.overrides)
        results[kind].append(result)
        shutil.rmtree(out)
        print(f"  run {repeat + 1} {kind}: first step {result['first_step']:.1f} s, "
              f"command {result['wall']:.1f} s", flush=True)  # fmt: skip
      size = sum(f.stat().st_size for f in (cache / "xla").rglob("*") if f.is_file())
      print(f"  cache: {size / 2**20:.1f} MiB", flush=True)
  medians = {
    kind: {key: statistics.median(r[key] for r in rows) for key in ("first_step", "wall")}
    for kind, rows in results.items()
  }
  for key, name in (("first_step", "first step"), ("wall", "command")):
    cold, warm = medians["cold"][key], medians["warm"][key]
    print(f"{name}: cold {cold:.1f} s, warm {warm:.1f} s, RATIO warm/cold {warm / cold:.3f}")


if __name__ == "__main__":
  main()
