"""The command line's jobs, from Python: train, plan, sweep and export a run.

- `main(argv)`: the `tunix-ppo-ext` command itself (`train`, `plan`, `sweep`, `export`,
  `plugins`), returning its exit status; what a notebook calls to run a job as the shell
  would; `console_main()`: the installed `tunix-ppo-ext` script (`main`, then exit with its
  status).
- `train(resolved)`: the main job on a `ResolvedRun` (or a `RunConfig`, resolved first),
  resuming from the output directory's checkpoints; returns the summary.
- `build_run(resolved, output_dir)`: what `train` builds, untrained: the learner over
  tunix's cluster, the training and evaluation batches and the best reachable return.
- `plan(resolved, topology)`: the run's jitted pieces compiled for a TPU topology, with
  their memory per chip (`format_plan` prints it as the command does).
- `sweep(seeds, output_dir, overrides)`: seeds times variants of a run, with their table;
  `seed_result(run_dir)`: what the table takes from one seed (curves, final success, ...).
- `export_run(run_dir, out_dir)`: a trained run's policy as a Hugging Face checkpoint.

Every name here but `main` and `console_main` loads tunix, on first use: importing this
module (what the installed script does) loads neither JAX nor tunix, so `--help` is
immediate; a job loads them when it runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tunix_ppo_ext import _lazy_attributes
from tunix_ppo_ext._src.run.cli import console_main, main

if TYPE_CHECKING:
  from tunix_ppo_ext._src.run.export_cmd import export_run
  from tunix_ppo_ext._src.run.job import build_run
  from tunix_ppo_ext._src.run.plan import format_plan, plan
  from tunix_ppo_ext._src.run.run_config import ResolvedRun, RunConfig
  from tunix_ppo_ext._src.run.sweep import seed_result, sweep

# name -> module that defines it; imported on first access (these import tunix).
_LAZY = {
  "build_run": "tunix_ppo_ext._src.run.job",
  "export_run": "tunix_ppo_ext._src.run.export_cmd",
  "format_plan": "tunix_ppo_ext._src.run.plan",
  "plan": "tunix_ppo_ext._src.run.plan",
  "seed_result": "tunix_ppo_ext._src.run.sweep",
  "sweep": "tunix_ppo_ext._src.run.sweep",
}

__all__ = [
  "build_run",
  "console_main",
  "export_run",
  "format_plan",
  "main",
  "plan",
  "seed_result",
  "sweep",
  "train",
]

__getattr__, __dir__ = _lazy_attributes(_LAZY, globals(), __name__)


def train(resolved: ResolvedRun | RunConfig, meshes: dict | None = None) -> dict[str, Any]:
  """Runs the main job (`tunix-ppo-ext train`); returns (and, on process 0, writes) the
  summary. A `RunConfig` is resolved first (`config.load_resolved` resolves a file's).

  With checkpoints in the output directory it resumes from the latest step that both actor
  and critic saved; a run that is already complete is left as it is and its summary
  returned. Other processes of a multi-host run write no files and return `{}`.

  Args:
    resolved: the run, resolved (`config.load_resolved`) or as a `RunConfig`.
    meshes: the meshes per role, when built already; None: built here, once.

  Returns:
    The run's summary (`{}` on processes other than 0).
  """
  from tunix_ppo_ext._src.run import job, run_config

  return job.train(run_config.as_resolved(resolved, "train"), meshes)
