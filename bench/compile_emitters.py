"""XLA:CPU's two fusion code generators on one program made larger, side by side.

The test suite compiles with the loop emitters (`xla_cpu_use_fusion_emitters=false`,
`tests/helpers/compile_settings.py`): its toy runs compile hundreds of small programs, and
the fusion emitters cost more per program. The suite's real-size subprocesses use the
fusion emitters (`large_program_env`), which cost less per fusion. This bench compiles one
program at growing sizes: `jax.jit` of an optax Adam update with global-norm clipping and a
finiteness check (the per-leaf work of a train step's optimizer) over `N` leaves of
`[576, 8]` float32, in a fresh process per setting (the suite's other flags: LLVM -O0, one
codegen module), and prints each compile's seconds and the loop/fusion ratio.

  python bench/compile_emitters.py [--leaves 200 400 800]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_parallel_codegen_split_count=1"
PROGRAM = """
import sys, time
import jax, jax.numpy as jnp, optax
n = int(sys.argv[1])
params = {f"p{i}": jnp.zeros((576, 8), jnp.float32) for i in range(n)}
tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-4))

def step(p, s, g):
  updates, s = tx.update(g, s, p)
  finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(g)]))
  return optax.apply_updates(p, updates), s, finite

lowered = jax.jit(step, donate_argnums=(0, 1)).lower(params, tx.init(params), params)
start = time.perf_counter()
lowered.compile()
print(time.perf_counter() - start)
"""


def compile_seconds(leaves: int, fusion_emitters: bool) -> float:
  """The update's compile time over `leaves` leaves, in a fresh process."""
  flags = f"{FLAGS} --xla_cpu_use_fusion_emitters={str(fusion_emitters).lower()}"
  env = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
  env.pop("JAX_COMPILATION_CACHE_DIR", None)  # every compile is a cold one
  done = subprocess.run(
    [sys.executable, "-c", PROGRAM, str(leaves)], env=env, capture_output=True, text=True
  )
  if done.returncode != 0:
    raise SystemExit(f"compile_emitters: the program failed: {done.stderr[-2000:]}")
  return float(done.stdout.split()[-1])


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--leaves", type=int, nargs="+", default=[200, 400, 800])
  args = parser.parse_args()
  print("| leaves | loop emitters s | fusion emitters s | loop / fusion |")
  print("| --- | --- | --- | --- |")
  for leaves in args.leaves:
    loop, fusion = compile_seconds(leaves, False), compile_seconds(leaves, True)
    print(f"| {leaves} | {loop:.1f} | {fusion:.1f} | {loop / fusion:.2f} |", flush=True)


if __name__ == "__main__":
  main()
