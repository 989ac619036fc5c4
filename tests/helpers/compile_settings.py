"""How the suite compiles: XLA:CPU's flags and JAX's persistent compilation cache.

They are environment variables, set before JAX is imported (it reads them once): by
`tests/conftest.py` for the test processes and the subprocesses they start, and by
`.ci/run` for tunix's own tests run with our classes (`python -m tests.helpers.compile_settings`
prints them as shell `export` lines). A value the caller already set wins.

- **One persistent compilation cache** (`JAX_CACHE`) for both xdist workers, every
  subprocess and tunix's own tests, every program kept (minimum compile time 0). The toy
  runs compile the same programs again and again. Entries are keyed by the program and by
  the jax and XLA versions and flags, so none is ever used for another program.
- **XLA:CPU flags that compile fast** (`XLA_FLAGS`): the same HLO programs (XLA's own passes,
  fusion decisions and buffer assignment; no fast-math either way), built with less work.
  On a cold cache compiling is most of the suite's CPU time.
  - LLVM at -O0 (`xla_backend_optimization_level`): a cold run took 2750 CPU-s against
    3400 at the default.
  - The loop emitters for fusions instead of the MLIR fusion emitters
    (`xla_cpu_use_fusion_emitters`), and each program as one LLVM module
    (`xla_cpu_parallel_codegen_split_count`): `test_learner.py` + `test_shared_prompts.py`
    from an empty cache in one process took 244 user-s before and 95 after (189 -> 99 s
    wall, 2026-12-06, this 2-core machine), every value asserted unchanged; a toy `train`
    (`configs/smoke.yaml`) 22 -> 9 user-s.
  The toy programs still run in milliseconds. An XLA without one of these flags refuses to
  start (XLA's own error names the flag): drop it here.
- **A real-size plan compiles with the fusion emitters** (`LARGE_PROGRAMS`, through
  `large_program_env`): they cost more per program and less per fusion. The toy `train`
  (`--config configs/smoke.yaml`) took 17 user-s with the loop emitters and 32 with the
  fusion emitters; SmolLM2-135M's full fine-tuning train step (about 2,500 fusions;
  `--config configs/smollm2.yaml model.lora=null train.steps=1`) compiled in 58 s with the
  loop emitters and 28 s with the fusion emitters, and the Qwen3-0.6B train-step plan in
  `test_plan.py` took 71 s and 43 s (2026-12-07, this 2-core machine beside a training run;
  `bench/compile_emitters.py` compares the two on one program at growing sizes). The
  tunix-agentic launcher tests, real models too, were no faster with them (their many
  small programs).
"""

from __future__ import annotations

import os
import pathlib
import shlex
from collections.abc import Mapping

JAX_CACHE = pathlib.Path(__file__).resolve().parents[2] / "build" / "jax-test-cache"
XLA_FLAGS = {
  "xla_backend_optimization_level": "0",
  "xla_cpu_use_fusion_emitters": "false",
  "xla_cpu_parallel_codegen_split_count": "1",
}

LARGE_PROGRAMS = {"xla_cpu_use_fusion_emitters": "true"}


def settings(environ: Mapping[str, str]) -> dict[str, str]:
  """The compile settings' variables over `environ`'s: the cache directory and minimum
  compile time unless set, and `XLA_FLAGS` with each flag of `XLA_FLAGS` it lacks added."""
  flags = environ.get("XLA_FLAGS", "")
  for flag, value in XLA_FLAGS.items():
    if f"--{flag}=" not in flags:
      flags = f"{flags} --{flag}={value}".strip()
  return {
    "JAX_COMPILATION_CACHE_DIR": environ.get("JAX_COMPILATION_CACHE_DIR", str(JAX_CACHE)),
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": environ.get(
      "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0"
    ),
    "XLA_FLAGS": flags,
  }


def large_program_env(environ: Mapping[str, str]) -> dict[str, str]:
  """`environ` (the suite's, `settings` applied) with each flag of `LARGE_PROGRAMS` set to
  its value there: the environment of a subprocess that compiles a real-size model."""
  flags = [
    flag
    for flag in environ.get("XLA_FLAGS", "").split()
    if flag.removeprefix("--").split("=")[0] not in LARGE_PROGRAMS
  ]
  flags += [f"--{flag}={value}" for flag, value in LARGE_PROGRAMS.items()]
  return {**environ, "XLA_FLAGS": " ".join(flags)}


if __name__ == "__main__":
  for name, value in settings(os.environ).items():
    print(f"export {name}={shlex.quote(value)}")
