"""`tunix-ppo-ext export RUN_DIR OUT_DIR`: a run's trained policy as a Hugging Face checkpoint.

The policy is rebuilt from the run's saved `config.json` (as `train` builds it), its
parameters restored from the latest finalized actor checkpoint (`checkpoints/actor/<step>`),
and written to `OUT_DIR` as `config.json` + `model.safetensors`, loadable by
`transformers.AutoModelForCausalLM.from_pretrained(OUT_DIR)`. The tokenizer files are
copied when the run used a Hugging Face tokenizer (`model.tokenizer` or the checkpoint's own);
the built-in character tokenizer has none. A run from a checkpoint keeps its family and
`config.json`; a built-in toy or named-size model is written as a Qwen3. A LoRA run's
checkpoint holds only the adapters: they are restored onto the base weights and merged into
them (`W + alpha/rank * A B`, `tunix.lora.merged`).
"""

from __future__ import annotations

import pathlib

from tunix_ppo_ext._src.checks import ConfigError
from tunix_ppo_ext._src.run import job, resume
from tunix_ppo_ext._src.run.run_config import (
  RunConfig,
  load_run_config,
  lora_section,
  tokenizer_directory,
)
from tunix_ppo_ext._src.tunix.models import hf_export, hf_models, lora

RUN_CONFIG = "config.json"


def check_out_dir(out_dir: pathlib.Path) -> None:
  """OUT_DIR must not exist, or be an empty directory; ValueError naming it otherwise."""
  if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
    raise ConfigError(
      f"OUT_DIR {str(out_dir)!r} exists and is not empty: export into a new or empty directory"
    )


def latest_actor_step(run_dir: pathlib.Path) -> int:
  """The newest step orbax finished writing under `RUN_DIR/checkpoints/actor`; ValueError
  naming the run when it has none (or is no run directory at all)."""
  if not (run_dir / RUN_CONFIG).is_file():
    raise ConfigError(
      f"RUN_DIR {str(run_dir)!r} has no {RUN_CONFIG}: give a train command's output directory"
    )
  steps = resume.finalized_steps(run_dir / "checkpoints" / "actor")
  if not steps:
    raise ConfigError(
      f"RUN_DIR {str(run_dir)!r} has no finalized actor checkpoint in checkpoints/actor: "
      "train until a checkpoint is saved (train.checkpoint_every) first"
    )
  return max(steps)


def trained_policy(run_dir: pathlib.Path) -> tuple[RunConfig, object, int]:
  """`(run, policy, step)`: the run's config, its policy with the latest actor checkpoint's
  parameters, and that step. The policy is built as `train` builds it (with its critic and
  reference, then dropped); a LoRA policy comes back with its adapters merged."""
  step = latest_actor_step(run_dir)
  run = load_run_config(str(run_dir / RUN_CONFIG), [f"output_dir={run_dir}"])
  policy = job._models(run, job._tokenizer(run))[0]  # noqa: SLF001 (the job's own builder)
  hf_export.restore_params(policy, run_dir / "checkpoints" / "actor", step)
  section = lora_section(run.model)
  if section is not None:
    policy = lora.merged(policy, section.spec())
  return run, policy, step


def export_run(run_dir: str | pathlib.Path, out_dir: str | pathlib.Path) -> pathlib.Path:
  """Writes the run's trained policy (and tokenizer, if any) into `out_dir`; returns it."""
  run_dir, out_dir = pathlib.Path(run_dir).resolve(), pathlib.Path(out_dir).resolve()
  check_out_dir(out_dir)
  run, policy, _ = trained_policy(run_dir)
  source = None
  if run.model.checkpoint is not None:
    source = hf_models.read_hf_config(run.model.checkpoint)
  hf_export.save_hf_checkpoint(policy, out_dir, source)
  tokenizer = tokenizer_directory(run.model)
  if tokenizer is not None:
    import transformers  # noqa: PLC0415 (only for runs with a Hugging Face tokenizer)

    transformers.AutoTokenizer.from_pretrained(tokenizer).save_pretrained(out_dir)
  return out_dir
