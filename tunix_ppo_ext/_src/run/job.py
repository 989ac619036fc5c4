"""The main job: a validated run config to a trained run directory.

`build_run` builds the learner (tunix's cluster, the models, the multi-turn rollout) and
the batches; `train` runs it, resuming from the output directory's checkpoints, writes
`summary.json` (`summarize`, over every part of a resumed run) and prints the run's end
(`report.end_lines`); `finished_run` says when there is nothing left to train.
"""

from __future__ import annotations

import contextlib
import functools
import json
import pathlib
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from tunix_ppo_ext._src.checks import ConfigError
from tunix_ppo_ext._src.data.char_tokenizer import CharTokenizer
from tunix_ppo_ext._src.data.chat import ChatFormat
from tunix_ppo_ext._src.data.trajectory import episode_batches
from tunix_ppo_ext._src.metrics import collapse, sinks
from tunix_ppo_ext._src.metrics import keys as metric_keys
from tunix_ppo_ext._src.metrics import samples as sample_log
from tunix_ppo_ext._src.metrics.sinks import read_jsonl
from tunix_ppo_ext._src.plugins import registry as plugin_registry
from tunix_ppo_ext._src.run import distributed, recipe, report, resume, run_dir
from tunix_ppo_ext._src.run.run_config import (
  ResolvedRun,
  RunConfig,
  as_resolved,
  check_turn_tokens,
)
from tunix_ppo_ext._src.tunix.cluster.cluster_setup import build_cluster
from tunix_ppo_ext._src.tunix.cluster.mesh import (
  Role,
  check_batch_divisible,
  check_multi_turn_rollout_mesh,
  role_meshes,
)
from tunix_ppo_ext._src.tunix.learner.ppo_learner import AlreadyAtMaxSteps, PpoExtLearner
from tunix_ppo_ext._src.tunix.models import lora
from tunix_ppo_ext._src.tunix.models.role_models import build_roles
from tunix_ppo_ext._src.tunix.rollout.multi_turn import MultiTurnRollout
from tunix_ppo_ext._src.tunix.rollout.sources import ObservationsInLoss

RETURN_KEY = metric_keys.SUMMARY_KEY
STEP_TIME_KEY = "timing_s/step"  # logged as each step ends
SHOWN_METRICS = {  # published key -> progress-bar label
  RETURN_KEY: "return",
  "actor/entropy": "entropy",
  "actor/kl": "kl",
  STEP_TIME_KEY: "step_s",
}


def build_run(
  resolved: ResolvedRun | RunConfig, output_dir: pathlib.Path, meshes: dict | None = None
):
  """`(learner, train_batches, eval_batches, env_max_return)` for a resolved run config (a
  `RunConfig` is resolved first); `meshes`: the command's `run_meshes` (built here when None).

  Args:
    resolved: the run, resolved (`config.load_resolved`) or as a `RunConfig`.
    output_dir: the run's output directory (checkpoints, metrics).
    meshes: the meshes per role; None: built here.

  Returns:
    `(learner, train_batches, eval_batches, env_max_return)`.
  """
  resolved = as_resolved(resolved, "build_run")
  return _build_run(resolved, output_dir, run_meshes(resolved.run) if meshes is None else meshes)


def _build_run(resolved: ResolvedRun, output_dir: pathlib.Path, meshes: dict):
  """`build_run` of a resolved run on its meshes."""
  run, ppo, models = resolved.run, resolved.ppo, resolved.models
  check_attention_backend(models.spec.attention, jax.default_backend())
  tokenizer = _tokenizer(resolved)
  _check_round_trip(tokenizer, resolved)
  _check_reply_tokens(tokenizer, resolved)
  recipe.check_top_k(run.sampling, models.vocab_size(len(tokenizer)))
  policy, critic, reference = build_roles(models, len(tokenizer), meshes.get(Role.ACTOR))
  if not ppo.uses_critic:  # group estimators: no critic trained or checkpointed
    critic = None
  keys = resolved.metric_keys
  wandb_sinks: list[sinks.WandbSink] = []  # tunix's logger builds it; samples use it too
  max_return = resolved.max_return
  backends = _metric_backends(resolved, keys, output_dir, wandb_sinks)
  cluster = build_cluster(
    policy,
    critic,
    tokenizer,
    resolved.cluster,
    reference=reference,
    role_meshes=meshes,
    optimizers=resolved.optimizers,
    checkpoint_dir=str(output_dir / "checkpoints"),
    metrics_dir=str(output_dir / "tensorboard"),
    metric_backends=distributed.primary_only(jax.process_index(), backends),
    metric_keys=keys,
  )
  writer = _sample_writer(output_dir, wandb_sinks, resolved.updates_per_batch)
  source = _trajectory_source(resolved, tokenizer, writer)
  shadow = tuple(resolved.run.metrics.shadow_estimators)
  learner = PpoExtLearner(cluster, ppo, trajectory_source=source, shadow_estimators=shadow)
  lora.keep_base_shared(cluster)  # LoRA: one copy of the base weights between steps
  train_batches, eval_batches = _prompt_batches(resolved)
  return learner, train_batches, eval_batches, max_return


def _metric_backends(
  resolved: ResolvedRun,
  keys: metric_keys.MetricKeys,
  output_dir: pathlib.Path,
  wandb_sinks: list[sinks.WandbSink],
) -> list[Callable[[], Any]]:
  """The run's metric sinks as factories (`metrics.jsonl`, the progress bar, the Echo Trap
  watch against the run's `max_return`, W&B unless disabled, which lands in `wandb_sinks`
  when built, and the configured plugin sinks)."""
  run, config, max_return = resolved.run, resolved.config, resolved.max_return
  shown = {keys.final(k): label for k, label in SHOWN_METRICS.items() if keys.final(k)}
  step_done = keys.final(STEP_TIME_KEY)  # the bar compiles until the first one
  backends = [  # process 0 only (tunix's metrics logger also creates sinks only there)
    lambda: sinks.JsonlBackend(output_dir / "metrics.jsonl"),
    lambda: sinks.ProgressBackend(run.train.steps, shown, step_done),
    lambda: collapse.EchoTrapWatch(keys, run.metrics.echo_trap, max_return),
  ]
  if run.wandb != "disabled":
    backends.append(lambda: _kept(wandb_sinks, sinks.WandbSink(run.wandb, output_dir, config)))
  for sink in run.sinks:  # extra sinks by name: `tunix_ppo_ext.metric_sinks` entry points
    build_sink = functools.partial(plugin_registry.build, plugin_registry.METRIC_SINKS, sink)
    backends.append(functools.partial(build_sink, output_dir, config))
  return backends


def _trajectory_source(resolved: ResolvedRun, tokenizer: Any, writer: Any) -> Any:
  """The multi-turn rollout wrapped, in order, by: observations in the loss (if asked),
  validation's own rollout, DAPO, score shaping and group filtering."""
  run = resolved.run
  evaluation = _validation_rollout(resolved, writer)
  source: Any = MultiTurnRollout(
    run.env.name,
    run.env.kwargs,
    envs=list(resolved.rollout_envs) or None,
    max_completion_len=run.env.max_completion_len,
    max_turns=run.env.max_turns,
    max_turn_tokens=run.env.max_tokens_per_turn,
    kv_cache=run.env.kv_cache,
    on_samples=writer,
    num_samples=run.train.eval_samples,
    chat=ChatFormat(tokenizer) if run.env.chat_template else None,
  )
  if run.env.loss_on_observations:
    source = ObservationsInLoss(source)
  budget = resolved.episode_budget
  return recipe.wrapped_source(
    source, evaluation, run.validation, run.dapo, budget, run.shaping, run.filter
  )


def _prompt_batches(resolved: ResolvedRun) -> tuple[Any, list[Any]]:
  """`(train_batches, eval_batches)`: the training prompts' iterator and the evaluation
  batches (the run's own episodes, or the validation section's)."""
  run, num_generations = resolved.run, resolved.num_generations
  train, prompts_per_batch = run.train, resolved.prompts_per_batch
  env_ids = recipe.entry_env_ids(run.envs)
  train_batches = episode_batches(train.steps, prompts_per_batch, seed=run.seed, env_ids=env_ids)
  if run.validation.is_default():
    eval_batches = list(
      episode_batches(train.eval_batches, prompts_per_batch, seed=run.seed + 1, env_ids=env_ids)
    )
  else:
    eval_batches = recipe.validation_batches(
      run.validation,
      list(resolved.validation_entries),
      train.eval_batches,
      train.batch_size,
      num_generations,
      run.seed + 1,
    )
  return train_batches, eval_batches


def _validation_rollout(resolved: ResolvedRun, on_samples: Any) -> MultiTurnRollout:
  """The multi-turn rollout of the `validation` section (environment(s), group size); its
  evaluation samples go to `on_samples` like the training environment's."""
  run, val = resolved.run, resolved.run.validation
  return MultiTurnRollout(
    resolved.validation_env.name,
    resolved.validation_env.kwargs,
    envs=list(resolved.validation_envs) or None,
    max_completion_len=run.env.max_completion_len,
    max_turns=run.env.max_turns,
    max_turn_tokens=run.env.max_tokens_per_turn,
    group_size=val.group_size,
    kv_cache=run.env.kv_cache,
    on_samples=on_samples,
    num_samples=run.train.eval_samples,
  )


def _kept(kept: list, sink):
  """`sink`, remembered in `kept`."""
  kept.append(sink)
  return sink


def _sample_writer(
  output_dir: pathlib.Path, wandb_sinks: list, updates_per_batch: int
) -> sample_log.SampleWriter | None:
  """Writes each evaluation's sampled conversations to `samples.jsonl` and W&B (process 0),
  at the step of its metrics (optimizer updates done)."""
  if not distributed.is_primary(jax.process_index()):
    return None
  return sample_log.SampleWriter(
    output_dir / sample_log.FILENAME,
    lambda: wandb_sinks[-1] if wandb_sinks else None,
    updates_per_batch=updates_per_batch,
  )


def check_attention_backend(attention: str, backend: str) -> None:
  """ConfigError unless `model.attention` runs on this JAX backend (splash: TPU only)."""
  if attention == "splash" and backend != "tpu":
    raise ConfigError(
      f"config key 'model.attention'='splash' runs tunix's TPU splash kernel, not on {backend}: "
      "use model.attention=dense here (`plan --compiler tpu` compiles splash for a TPU from "
      "any machine)"
    )


def run_meshes(run: RunConfig) -> dict:
  """tunix's `role_to_mesh` for the run's `mesh` section on this runtime's devices.

  Raises ValueError when a mesh needs more devices than `jax.device_count()` or the batch
  does not divide by the trainers' fsdp size.
  """
  meshes = role_meshes(run.mesh)
  check_batch_divisible(meshes, run.train.batch_size)
  check_multi_turn_rollout_mesh(meshes)  # the main job's rollout is multi-turn
  return meshes


def _tokenizer(resolved: ResolvedRun):
  """The Hugging Face tokenizer of `model.tokenizer` (or the checkpoint's), else the built-in
  character tokenizer.

  The built-in one keeps EOS and pad distinct: tunix's sampler masks pad ids in context.
  """
  directory = resolved.tokenizer_dir  # a checkpoint's own tokenizer by default
  if directory is not None:
    import transformers

    return transformers.AutoTokenizer.from_pretrained(directory)
  alphabet = resolved.run.model.alphabet
  return CharTokenizer(**({} if alphabet is None else {"alphabet": alphabet}))


def _check_round_trip(tokenizer: Any, resolved: ResolvedRun) -> None:
  """Refuses a Hugging Face tokenizer that changes the text it encodes: the first
  environment's first observation must come back from `decode(encode(text))` as it was
  (a tokenizer class picked for another file layout can drop spaces and newlines)."""
  directory, text = resolved.tokenizer_dir, resolved.first_observation
  if directory is None or text is None:  # the built-in character tokenizer refuses what
    return  # it cannot encode
  back = tokenizer.decode(tokenizer.encode(text, add_special_tokens=False))
  if back != text:
    raise ConfigError(
      f"the tokenizer in {directory!r} ({type(tokenizer).__name__}) changes the text it "
      f"encodes: {text[:40]!r} comes back as {back[:40]!r}; use the checkpoint's own "
      "tokenizer files (model.tokenizer), whose decode(encode(text)) is the text"
    )


def _check_reply_tokens(tokenizer: Any, resolved: ResolvedRun) -> None:
  """`check_turn_tokens` with a Hugging Face tokenizer (the built-in one's is checked at
  load): each environment's longest reply must fit in `env.max_tokens_per_turn` tokens."""
  directory = resolved.tokenizer_dir
  if directory is None:
    return

  def count(text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False))

  how = f"the tokenizer in {directory!r}"
  check_turn_tokens(resolved.run.env.max_tokens_per_turn, resolved.longest_replies, count, how)


def build_models(resolved: ResolvedRun | RunConfig, mesh: Any = None) -> tuple[Any, Any, Any]:
  """`(policy, critic, reference)` as `train` builds them (`role_models.build_roles`), with
  the run's own tokenizer (`export` restores a checkpoint onto the policy; tests compare
  the roles).

  Args:
    resolved: the run, resolved (`config.load_resolved`) or as a `RunConfig`.
    mesh: the mesh a checkpoint's weights are sharded onto; None: the first device.

  Returns:
    `(policy, critic, reference)`.
  """
  resolved = as_resolved(resolved, "build_models")
  return build_roles(resolved.models, len(_tokenizer(resolved)), mesh)


def summarize(
  metrics_path: pathlib.Path, max_return: float, wall_s: float, return_key: str = RETURN_KEY
) -> dict[str, Any]:
  """`first_return`, `final_return` (mean of the last tenth of steps), `best_return` (the
  best step's), `max_return` (the best possible), `steps` (batches) and `wall_s`.

  `return_key`: where `metrics.jsonl` holds the mean episode return (after renames).
  """
  returns = [row[return_key] for row in read_jsonl(metrics_path) if row.get(return_key) is not None]
  if not returns:
    raise RuntimeError(f"no {return_key!r} values in {metrics_path}")
  tail = max(1, len(returns) // 10)
  return {
    "first_return": float(returns[0]),
    "final_return": float(np.mean(returns[-tail:])),
    "best_return": float(max(returns)),
    "max_return": float(max_return),
    "steps": len(returns),
    "wall_s": round(wall_s, 1),
  }


def train(resolved: ResolvedRun, meshes: dict | None = None) -> dict[str, Any]:
  """Runs the main job; returns (and, on process 0, writes) the summary.

  Args:
    resolved: the command's `ResolvedRun` (`tunix_ppo_ext.jobs.train` resolves a
      `RunConfig` first).
    meshes: its `run_meshes`, when the command built them already (else built here, once).

  Returns:
    The run's summary (`{}` on processes other than 0).

  With checkpoints in the output directory it resumes from the latest step that both actor
  and critic saved (after `run_dir.check_rerun` accepted the requested config), and
  `metrics.jsonl` drops the rows an interrupted run wrote after it. A run that is already
  complete (`run_dir.finished_summary`) is left as it is: one line says so and its summary
  is returned. One run at a time per directory (`run_dir.RunLock`); a directory that holds
  something other than a run is refused untouched (`run_dir.check_output_dir`). Other
  processes of a multi-host run write no files and return `{}`.
  """
  check_jax_precision()
  out = pathlib.Path(resolved.run.output_dir).resolve()  # orbax wants absolute paths
  primary = distributed.is_primary(jax.process_index())
  if primary:
    run_dir.check_output_dir(out)  # a directory that is not a run's: refused, untouched
  run_dir.make_output_dir(out)
  lock = run_dir.RunLock(out) if primary else contextlib.nullcontext()
  with lock:
    finished = _finished(out, resolved) if primary else None
    return finished if finished is not None else _train_in(out, resolved, primary, meshes)


def check_jax_precision() -> None:
  """ConfigError unless JAX runs in its default 32-bit mode: with `JAX_ENABLE_X64=1`
  tunix's sampler fails once the models are built (its cache index is int64 beside int32
  ones: `dynamic_update_slice`'s TypeError), after the run's directory was made."""
  if jax.config.jax_enable_x64:
    raise ConfigError(
      "JAX_ENABLE_X64 is on (jax_enable_x64=True): tunix's sampler needs JAX's default "
      "32-bit mode; unset JAX_ENABLE_X64 (or set it to 0) for this command"
    )


def finished_run(resolved: ResolvedRun) -> dict[str, Any] | None:
  """The summary of the run in `output_dir` when it is already complete (after printing the
  line that says so), else None. Reads only, not even taking the directory's lock (a run
  holding it is refused as `train` refuses it): the command asks before it opens anything."""
  out = pathlib.Path(resolved.run.output_dir).resolve()
  run_dir.check_output_dir(out)
  if not (out / run_dir.SUMMARY).is_file():
    return None
  run_dir.RunLock(out).check_free()
  return _finished(out, resolved)


def _finished(out: pathlib.Path, resolved: ResolvedRun) -> dict[str, Any] | None:
  """`finished_run`'s check (`train` makes it holding the directory's lock). A multi-host
  run is never taken for finished (the processes would have to agree): it resumes at its
  last step and trains none."""
  if jax.process_count() > 1:
    return None
  run = resolved.run
  saved = resume.common_step(out / "checkpoints", resolved.checkpoint_roles)
  run_dir.rerun_changes(out, resolved.config, saved, resolved.optimizers)  # refused: says so
  summary = run_dir.finished_summary(out, saved, run.train.steps)
  if summary is not None:
    print(report.finished_line(run.output_dir, summary, run.train.steps))
  return summary


def _build_restoring(resolved: ResolvedRun, out: pathlib.Path, primary: bool, meshes: dict):
  """`build_run`; when restoring the newest checkpoint fails inside orbax (a deleted or
  truncated file), that step is set aside (`checkpoints/damaged/`, nothing deleted) and the
  next older one is restored instead, with a warning naming both (single process only)."""
  roles = resolved.checkpoint_roles
  while True:
    try:
      return _build_run(resolved, out, meshes)
    except Exception as err:
      step = resume.align_role_checkpoints(out / "checkpoints", roles) if primary else None
      if step is None or jax.process_count() > 1 or not raised_in_orbax(err):
        raise
      resume.set_aside(out / "checkpoints", step, roles)
      older = resume.align_role_checkpoints(out / "checkpoints", roles)
      print(
        f"tunix-ppo-ext: warning: checkpoint step {step} cannot be restored "
        f"({type(err).__name__}); moved to {out / 'checkpoints' / resume.DAMAGED}, resuming "
        f"from {'step ' + str(older) if older else 'scratch'}",
        file=sys.stderr,
      )
      sinks.truncate_jsonl(out / "metrics.jsonl", older if older else -1)


def raised_in_orbax(err: BaseException) -> bool:
  """Whether `err` (or what caused it) was raised inside orbax or tensorstore."""
  while err is not None:
    frames = traceback.extract_tb(err.__traceback__)
    if any("orbax" in f.filename or "tensorstore" in f.filename for f in frames):
      return True
    err = err.__cause__ or err.__context__
  return False


def _train_in(
  out: pathlib.Path, resolved: ResolvedRun, primary: bool, meshes: dict | None
) -> dict[str, Any]:
  meshes = run_meshes(resolved.run) if meshes is None else meshes
  parts = _prepare(out, resolved) if primary else []
  distributed.barrier("tunix-ppo-ext:checkpoints-aligned")
  start, started = time.perf_counter(), time.time()
  learner, train_batches, eval_batches, max_return = _build_restoring(
    resolved, out, primary, meshes
  )
  restored = learner.rl_cluster.actor_trainer.train_steps  # tunix restored it while building
  if restored:
    print(f"tunix-ppo-ext: resuming from step {restored} ({out / 'checkpoints'})", file=sys.stderr)
  part = {"from_step": int(restored), "started": started, "wall_s": None}
  if primary:
    run_dir.write_parts(out, [*parts, part])
  try:
    with warnings.catch_warnings():  # a run killed after its last checkpoint: nothing to do
      warnings.simplefilter("ignore", AlreadyAtMaxSteps)
      learner.train(train_batches, eval_ds=eval_batches)
  except BaseException as err:  # Ctrl-C or a failure: the saves being written end first
    if finish_saves(learner) and not isinstance(err, KeyboardInterrupt):
      raise KeyboardInterrupt from err  # Ctrl-C while they were written: still a Ctrl-C
    raise
  finally:  # a failed or interrupted part counts too (a killed one: `earlier_parts`)
    part["wall_s"] = round(time.perf_counter() - start, 1)
    if primary:
      with contextlib.suppress(OSError):  # a full disk: the error that stopped it is the one
        run_dir.write_parts(out, [*parts, part])
  if not primary:
    return {}
  return _summarize_run(out, resolved, learner, max_return, [*parts, part])


def finish_saves(learner: PpoExtLearner) -> bool:
  """After an interrupted or failed `learner.train`: waits for the checkpoints still being
  written (orbax commits them on its own threads) and closes the trainers' checkpoint
  managers, with Ctrl-C held back meanwhile (`_deferred_interrupts`: once; pressed twice,
  the wait ends); returns whether Ctrl-C was pressed then.

  Without it the interpreter's exit ran under those threads (2026-12-07, Ctrl-C into a run
  saving every step): orbax's commits failed with "cannot schedule new futures after
  interpreter shutdown" tracebacks after the interrupted line, the likely cause of the
  segmentation faults (exit -11) reported for such runs. A save that fails to close is
  left as it is (a rerun resumes from the last committed step): the error that stopped the
  run is the one to report. tunix's own `close` is not used: it would save the
  interrupted step too.
  """
  cluster = learner.rl_cluster
  managers = [cluster.actor_trainer.checkpoint_manager]
  critic = getattr(cluster, "critic_trainer", None)
  managers += [critic.checkpoint_manager] if critic is not None else []
  with _deferred_interrupts() as pressed:
    for manager in managers:
      with contextlib.suppress(Exception):
        manager.close()  # orbax's close waits for the save in flight
  return bool(pressed)


@contextlib.contextmanager
def _deferred_interrupts() -> Iterator[list[int]]:
  """Holds Ctrl-C (SIGINT) back for the block: the list it yields records each press, and
  the previous handler is back after it. A second press within it raises KeyboardInterrupt
  (a way out of a wait that does not end). Off the main thread (where Python delivers
  signals) nothing is held."""
  pressed: list[int] = []
  if threading.current_thread() is not threading.main_thread():
    yield pressed
    return

  def hold(signum: int, frame: Any) -> None:
    pressed.append(signum)
    if len(pressed) > 1:
      raise KeyboardInterrupt

  previous = signal.signal(signal.SIGINT, hold)
  try:
    yield pressed
  finally:
    signal.signal(signal.SIGINT, previous)


def _prepare(out: pathlib.Path, resolved: ResolvedRun) -> list[dict[str, Any]]:
  """Before anything opens the run's files: the checkpoints aligned, the rerun's config
  checked and saved, `metrics.jsonl` and the samples cut back to the checkpoint; returns
  the run's earlier parts (`run_dir.earlier_parts`)."""
  saved = resume.align_role_checkpoints(out / "checkpoints", resolved.checkpoint_roles)
  run_dir.check_rerun(out, resolved.config, saved, resolved.optimizers)
  if saved and not (out / "metrics.jsonl").is_file():
    print(
      f"tunix-ppo-ext: warning: {out / 'metrics.jsonl'} is missing: resuming at step "
      f"{saved}, the steps before it have no metrics",
      file=sys.stderr,
    )
  parts = run_dir.earlier_parts(out, resuming=saved is not None)  # before the truncation
  # before the sink opens the file: rows an interrupted run logged after `saved` go
  sinks.truncate_jsonl_files(
    [out / "metrics.jsonl", out / sample_log.FILENAME], saved if saved else -1
  )
  return parts


def _summarize_run(
  out: pathlib.Path,
  resolved: ResolvedRun,
  learner: PpoExtLearner,
  max_return: float,
  parts: list[dict[str, Any]],
) -> dict[str, Any]:
  """Writes `summary.json`: `summarize`'s figures over every part of the run (`wall_s` their
  sum; `parts` each one's first step and wall time; `resumes` the steps it resumed at), the
  optimizer `updates` done and the memory report; then prints `report.end_lines`."""
  run = resolved.run
  sinks.compact_jsonl(out / "metrics.jsonl")  # one line per step, also after a resume
  keys = resolved.metric_keys
  return_key = keys.final(RETURN_KEY)  # never dropped: the config check says so
  wall_s = sum(part["wall_s"] for part in parts)
  summary = summarize(out / "metrics.jsonl", max_return, wall_s, return_key)
  summary["updates"] = int(learner.rl_cluster.actor_trainer.train_steps)
  summary["parts"] = [{"from_step": p["from_step"], "wall_s": p["wall_s"]} for p in parts]
  summary["resumes"] = [part["from_step"] for part in parts[1:]]
  summary["memory"] = lora.memory_report(learner.rl_cluster)
  sinks.write_atomically(out / run_dir.SUMMARY, json.dumps(summary, indent=2))
  sinks.ProgressBackend.close_all()  # the bar's last line before the report
  rows = read_jsonl(out / "metrics.jsonl")
  print("\n".join(report.end_lines(run.output_dir, summary, rows, keys)), flush=True)
  return summary
