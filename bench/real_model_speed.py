"""Where a real-model step goes, against each phase's floor, side by side for checkouts.

Trains `configs/smollm2.yaml` (SmolLM2-135M-Instruct on `guess`, or `--config`) for
`--steps` steps once per checkout per repeat, interleaved (checkout A, B, A, B, ...), each
run in a fresh process whose `tunix_ppo_ext` is the checkout's own (`NAME=PATH`; same
environment, config, seed). It prints, per checkout, the median over the steps after
`--warmup` of each phase (`timing_s/*`: rollout, old log-probs, reference, values,
advantages, actor and critic updates, the rest of the step) in seconds, its share of the
step, and its floor as a fraction of the time taken; then each checkout's median step over
the first checkout's (the ratios to read: the machine's load moves the times). Compilation
is counted apart: the first step, and the XLA compilations that start after `--warmup`
steps (`jax.monitoring`'s backend-compile events).

Floors come from this machine, measured in this process before the runs: the float32
matmul rate (GFLOP/s) and the memory read rate (GB/s), with the model's parameter count
(`summary.json`), the batch and the tokens each step processed:

- forward FLOPs: 2 x (parameters - head) per token of the pass, plus 2 x head per position
  that needs logits (the completion's); attention's own products are left out (small at
  these lengths), so every floor is a lower bound;
- rollout: the forward FLOPs of every prompt and completion token the batch fed, or the
  weights read once per decode step (batch `B`: `max_turns x max_tokens_per_turn` steps),
  whichever is larger;
- old / reference log-probs, values: one forward over `B x (P + T)` (P, T the real widths);
- actor update with LoRA: two forwards (the forward and the input-gradient backward; the
  frozen weights need no gradient); without LoRA three.

  python bench/real_model_speed.py [--steps 6 --warmup 2 --repeats 2 --profile]
      [--checkout base=../base --checkout new=.] [--variant NAME="KEY=VALUE ..."]
      [--resume-from RUN_DIR] [KEY=VALUE ...]

`--variant NAME="KEY=VALUE ..."` adds a run of this checkout with those overrides (e.g.
`--variant packed="model.packing=true"` beside the default `this=.`). `--resume-from` starts
every run from a copy of a finished run's directory (its `config.json`, checkpoints and
metrics) and times the `--steps` steps after its last: a trained policy's episodes, not the
initial one's (`--config` defaults to the run's own config then).

`--profile` traces the step after the warm-up of every run (`jax.profiler`, XLA's ops only)
and prints the jitted programs that took the most time in it, each with its total (`*`) and
its largest op kinds (each op's own time summed over threads, by kind).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

import jax
from _timing import device_rates

PHASES = ("rollout", "old_logp", "ref_logp", "values", "advantages")
UPDATES = ("update_actor", "update_critic")

# Run in the checkout's own process: trains, stamps each batch drawn and each compilation.
CHILD = r"""
import json, os, pathlib, sys, time
import jax
compiles = []
jax.monitoring.register_event_duration_secs_listener(
  lambda name, secs, **kw: compiles.append(time.perf_counter())
  if name == "/jax/core/compile/backend_compile_duration" else None)
import tunix_ppo_ext
from tunix_ppo_ext.config import load_run_config
from tunix_ppo_ext.jobs import build_run
out, config, overrides = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
run = load_run_config(config, [f"output_dir={out}", *overrides])
learner, batches, _, _ = build_run(run, out)
stamps, profile = [], os.environ.get("BENCH_PROFILE_STEP")
def timed(batches):
  for batch in batches:
    if profile and len(stamps) == int(profile) - 1:
      options = jax.profiler.ProfileOptions()  # XLA's ops only: a Python trace of a step
      options.python_tracer_level = 0          # passes the trace's 1M-event cap
      jax.profiler.start_trace(str(out / "trace"), create_perfetto_trace=True,
                               profiler_options=options)
    if profile and len(stamps) == int(profile):
      jax.profiler.stop_trace()
    stamps.append(time.perf_counter())
    yield batch
learner.train(timed(batches))
stamps.append(time.perf_counter())
model = learner.rl_cluster.actor_trainer.model
config = model.config
import flax, math
weights = jax.tree.leaves(flax.nnx.state(model, flax.nnx.Param))
params = sum(math.prod(x.shape) for x in weights)
dtype = max(weights, key=lambda x: x.size).dtype.name  # the frozen weights' (LoRA's are few)
shape = {"batch": run.train.batch_size, "prompt": run.train.max_prompt_length,
         "completion": run.env.max_completion_len,
         "decode_steps": run.env.max_turns * run.env.max_tokens_per_turn,
         "head": config.vocab_size * config.embed_dim, "params": params, "dtype": dtype,
         "weight_bytes": sum(x.nbytes for x in weights),
         "lora": run.model.lora is not None}
(out / "bench.json").write_text(json.dumps({"package": tunix_ppo_ext.__file__,
  "stamps": stamps, "compiles": compiles, "shape": shape}))
"""


def finished_steps(run_dir: pathlib.Path) -> int:
  """The last step a run directory's `metrics.jsonl` logged (0 for none)."""
  lines = (run_dir / "metrics.jsonl").read_text().splitlines()
  return max((json.loads(line).get("step", 0) for line in lines), default=0)


def run_checkout(path: pathlib.Path, args, out: pathlib.Path, extra: list[str]) -> dict:
  """Trains `args.steps` steps with `path`'s package and the `extra` overrides (after the
  steps of `args.resume_from`, copied to `out`): its metrics, summary, stamps, shape."""
  env = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(
      p for p in (str(path.resolve()), os.environ.get("PYTHONPATH")) if p
    ),
  }
  if args.profile:  # one step traced: the first after the warm-up
    env["BENCH_PROFILE_STEP"] = str(args.warmup + 1)
  start = 0
  if args.resume_from:
    shutil.copytree(args.resume_from, out)
    start = finished_steps(out)
  steps = f"train.steps={start + args.steps}"
  overrides = [steps, "train.eval_every=1000", "train.checkpoint_every=1000"]
  config = str(pathlib.Path(args.config).resolve())
  command = [sys.executable, "-c", CHILD, str(out), config, *overrides, *args.overrides, *extra]
  done = subprocess.run(command, env=env, cwd=path, stderr=subprocess.PIPE, text=True)
  if done.returncode:
    raise RuntimeError(f"{path}: the run failed ({done.returncode}):\n{done.stderr[-3000:]}")
  result = json.loads((out / "bench.json").read_text())
  if not result["package"].startswith(str(path.resolve())):
    raise RuntimeError(f"{path}: the run imported {result['package']}, not this checkout's")
  steps: dict[int, dict] = {}
  for line in (out / "metrics.jsonl").read_text().splitlines():
    row = json.loads(line)
    steps.setdefault(row.get("step", 0), {}).update(row)
  result["steps"] = {step: row for step, row in steps.items() if step > start}
  result["start"] = start
  return result


def top_ops(trace_dir: pathlib.Path, count: int = 8) -> list[tuple[str, float, int]]:
  """The XLA programs and op kinds that took the most time in a `jax.profiler` trace, each
  op's own time summed over threads: `(program/kind, seconds, calls)`, largest first. A
  program (`jit__train_step`, `jit__decode_fn_for_turn`, ...) is listed with its total
  (kind `*`), then its largest kinds (`ynn_fusion`: YNNPACK's products, ...)."""
  (path,) = trace_dir.glob("plugins/profile/*/perfetto_trace.json.gz")
  events = json.loads(gzip.decompress(path.read_bytes()))
  events = events["traceEvents"] if isinstance(events, dict) else events
  seconds: dict[tuple[str, str], float] = {}
  calls: dict[tuple[str, str], int] = {}
  for event in events:
    name, args = event.get("name", ""), event.get("args", {})
    # XLA's own ops carry `hlo_op`; a `while`, `call` or `cond` holds others (counted there)
    skipped = name.startswith(("while", "call", "cond")) or event.get("ph") != "X"
    if skipped or "hlo_op" not in args:
      continue
    program = args.get("hlo_module", "?")
    for key in ((program, "*"), (program, re.sub(r"\.\d+$", "", name))):
      seconds[key] = seconds.get(key, 0.0) + event.get("dur", 0) / 1e6
      calls[key] = calls.get(key, 0) + 1
  totals = sorted((k for k in seconds if k[1] == "*"), key=seconds.get, reverse=True)
  ranked = []
  for program, _ in totals[:4]:
    kinds = sorted((k for k in seconds if k[0] == program), key=seconds.get, reverse=True)
    ranked += kinds[: count // 2]
  return [(f"{p}/{k}", seconds[(p, k)], calls[(p, k)]) for p, k in ranked]


def medians(result: dict, warmup: int) -> dict:
  """Median seconds per phase and tokens per step over the steps after `warmup`; the first
  step (compilation) and the compilations that started after `warmup` steps."""
  stamps, start = result["stamps"], result.get("start", 0)
  rows = [row for step, row in result["steps"].items() if step > start + warmup]

  def median(key: str) -> float:
    return statistics.median(row.get(key, 0.0) for row in rows)

  out = {p: median(f"timing_s/{p}") for p in PHASES + UPDATES + ("step",)}
  out["first_step"] = result["steps"][start + 1]["timing_s/step"]
  out["completion_tokens"] = median("generation/completions/mean_length")
  out["agent_tokens"] = median("train/response_length/mean")
  out["compiles_after_warmup"] = sum(t > stamps[warmup] for t in result["compiles"])
  return out


def floors(result: dict, m: dict, rates: dict[str, float]) -> dict:
  """Seconds each phase would take at this machine's matmul rate for the run's weight
  dtype and its memory read rate (see the module docstring): the lower bounds the measured
  times are read against."""
  shape = result["shape"]
  gflops = rates[shape.get("dtype", "float32")]
  params = shape["params"]
  b, p, t, head = shape["batch"], shape["prompt"], shape["completion"], shape["head"]
  body = params - head  # a tied head counts once: its forward is the head's product

  def forward(rows: int, positions: int, logit_positions: int) -> float:
    return 2 * (body * rows * positions + head * rows * logit_positions) / (gflops * 1e9)

  fed = forward(b, p + m["completion_tokens"], shape["decode_steps"])
  weight_bytes = shape.get("weight_bytes", 4 * params)
  read = shape["decode_steps"] * weight_bytes / (rates["read"] * 1e9)
  one_pass = forward(b, p + t, t)
  return {
    "rollout": max(fed, read),
    "old_logp": one_pass,
    "ref_logp": one_pass,
    "values": one_pass,
    "update_actor": (2 if shape["lora"] else 3) * one_pass,
    "update_critic": (2 if shape["lora"] else 3) * one_pass,
  }


def report(name: str, runs: list[dict], base: dict | None, rates: dict[str, float]) -> dict:
  """Prints one checkout's table (medians over its runs) and its step and phase ratios to
  the first's medians `base`; returns its medians."""
  m = {k: statistics.median(r["m"][k] for r in runs) for k in runs[0]["m"]}
  floor = floors(runs[0]["result"], m, rates)
  step = m["step"]
  late = m["compiles_after_warmup"]
  print(
    f"\n== {name}: median step {step:.2f} s over {len(runs)} run(s); first step "
    f"{m['first_step']:.1f} s; compilations after the warm-up: {late:.0f}"
  )
  print(f"{'phase':14s} {'s':>7s} {'share':>7s} {'floor s':>8s} {'floor/s':>8s}")
  rest = step
  for phase in PHASES + UPDATES:
    seconds = m[phase]
    if seconds <= 0:
      continue
    rest -= seconds
    low = floor.get(phase)
    ratio = f"{low / seconds:8.2f}" if low else f"{'':8s}"
    print(f"{phase:14s} {seconds:7.2f} {seconds / step:7.1%} {low or 0:8.2f} {ratio}")
  print(f"{'rest':14s} {rest:7.2f} {rest / step:7.1%}")
  shape, rollout = runs[0]["result"]["shape"], m["rollout"]
  rows, dtype = shape["batch"], shape.get("dtype", "float32")
  limit = rates[dtype] * 1e9 / (2 * shape["params"])
  for kind in ("agent", "completion"):
    rate = m[f"{kind}_tokens"] * rows / rollout
    print(
      f"rollout {kind} tokens/s: {rate:.1f} ({rate / limit:.3f} of the {dtype} compute "
      f"limit {limit:.0f} tokens/s)"
    )
  if base is not None:
    print(
      f"STEP RATIO {name}/first: {step / base['step']:.3f} (speed-up {base['step'] / step:.2f}x)"
    )
    for phase in PHASES + UPDATES:
      if m[phase] > 0 and base[phase] > 0:
        print(f"PHASE RATIO {phase} {name}/first: {m[phase] / base[phase]:.3f}")
  return m


def main() -> None:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawTextHelpFormatter
  )
  parser.add_argument("--config", default="configs/smollm2.yaml")
  parser.add_argument("--steps", type=int, default=6)
  parser.add_argument("--warmup", type=int, default=2)
  parser.add_argument("--repeats", type=int, default=2, help="interleaved runs per checkout")
  parser.add_argument("--checkout", action="append", help="NAME=PATH (default: this=.)")
  parser.add_argument(
    "--profile", action="store_true", help="trace the step after the warm-up; top XLA ops"
  )
  parser.add_argument(
    "--variant", action="append", default=[], help='NAME="KEY=VALUE ...": this checkout so'
  )
  parser.add_argument("--resume-from", help="a finished run's directory to continue")
  parser.add_argument("overrides", nargs="*", help="KEY=VALUE config overrides")
  args = parser.parse_args()
  if args.resume_from and args.config == parser.get_default("config"):
    args.config = str(pathlib.Path(args.resume_from) / "config.json")
  checkouts = [(*c.split("=", 1), []) for c in args.checkout or ["this=."]]
  checkouts += [(v.split("=", 1)[0], ".", v.split("=", 1)[1].split()) for v in args.variant]
  rates = device_rates()
  print(
    f"jax {jax.__version__} on {jax.default_backend()} ({jax.devices()[0].device_kind}), "
    f"{os.cpu_count()} cores: matmul float32 {rates['float32']:.0f} GFLOP/s, bfloat16 "
    f"{rates['bfloat16']:.0f}, memory read {rates['read']:.1f} GB/s; {args.config}, "
    f"{args.steps} steps, medians after {args.warmup}, {args.repeats} interleaved repeats"
  )
  runs: dict[str, list[dict]] = {name: [] for name, _, _ in checkouts}
  with tempfile.TemporaryDirectory() as tmp:
    for repeat in range(args.repeats):
      for name, path, extra in checkouts:
        out = pathlib.Path(tmp) / f"{name}{repeat}"
        result = run_checkout(pathlib.Path(path), args, out, extra)
        runs[name].append({"result": result, "m": medians(result, args.warmup)})
        print(f"  run {repeat + 1} of {name}: step {runs[name][-1]['m']['step']:.2f} s", flush=True)
        if args.profile:
          for kind, seconds, calls in top_ops(pathlib.Path(tmp) / f"{name}{repeat}" / "trace"):
            print(f"    {kind:52s} {seconds:7.2f} s {calls:6d} calls", flush=True)
  base = None
  for name, _, _ in checkouts:
    medians_of = report(name, runs[name], base, rates)
    base = medians_of if base is None else base


if __name__ == "__main__":
  main()
