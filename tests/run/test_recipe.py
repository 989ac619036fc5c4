"""The recipe sections of the run config (`optim`, `batch`, `sampling`): clear errors, the
batch arithmetic handed to tunix, and a short run where the schedules show in `actor/lr`
and `critic/lr` and evaluation samples at its own temperature."""

import math

import numpy as np
import pytest

from tests.helpers.runs import SMOKE
from tests.helpers.schedules import reference_lr
from tunix_ppo_ext._src.envs.memory import MemoryEnv
from tunix_ppo_ext._src.envs.sokoban import SokobanEnv
from tunix_ppo_ext._src.metrics.samples import read_samples
from tunix_ppo_ext._src.metrics.sinks import read_jsonl
from tunix_ppo_ext._src.run import job, recipe
from tunix_ppo_ext._src.run.run_config import load_resolved, load_run_config
from tunix_ppo_ext._src.tunix.rollout.multi_turn import Mode

pytestmark = pytest.mark.tunix


@pytest.mark.parametrize(
  "overrides, message",
  [
    (["optim.actor.name=sgd"], r"'optim.actor.name'='sgd' unknown"),
    (["optim.critic.weight_decay=0.01"], r"'optim.critic.weight_decay'=0.01 needs .*adamw"),
    (["optim.actor.shedule=cosine"], r"unknown config key 'optim.actor.shedule'; did you mean"),
    (["batch.mini_batch_size=12"], r"'batch.mini_batch_size'=12 must divide train.batch_size=32"),
    (["batch.mini_batch_size=0"], r"'batch.mini_batch_size'=0 is invalid"),
    (
      ["batch.mini_batch_size=16", "batch.train_micro_batch_size=6"],
      r"'batch.train_micro_batch_size'=6 must divide the mini-batch=16: 16 / 6 = 2.66667",
    ),
    (
      ["batch.mini_batch_size=16", "batch.gradient_accumulation_steps=8", "ppo.num_generations=4"],
      r"'batch.train_micro_batch_size'=2 episodes must be a multiple of ppo.num_generations=4",
    ),
    (
      ["batch.train_micro_batch_size=8", "batch.gradient_accumulation_steps=4"],
      r"give one",
    ),
    (["batch.rollout_micro_batch_size=3"], r"'batch.rollout_micro_batch_size'=3 must divide"),
    (["sampling.top_p=1.5"], r"'sampling.top_p'=1.5 is invalid"),
    (["sampling.top_k=-1"], r"'sampling.top_k'=-1 is invalid"),
    (["sampling.eval_temperature=-0.1"], r"'sampling.eval_temperature'=-0.1 is invalid"),
    (["sampling.eval_top_p=0"], r"'sampling.eval_top_p'=0.0 is invalid"),
    (["shaping.method=zscore"], r"'shaping.method'='zscore' unknown"),
    (["shaping.grouping=stat"], r"'shaping.grouping'='stat' unknown; did you mean 'state'"),
    (["shaping.eps=0"], r"'shaping.eps'=0.0 is invalid"),
    (
      ["filter.keep_ratio=0.3", "ppo.num_generations=4"],
      r"'filter.keep_ratio'=0.3 keeps 0.3 x 8 groups = 2.4, not a whole number: .* chunks of "
      r"32 episodes",
    ),
    (["filter.by=spread"], r"'filter.by'='spread' unknown"),
    (["filter.keep_ratio=0"], r"'filter.keep_ratio'=0.0 is invalid"),
    (["validation.group_size=3"], r"'validation.group_size'=3 must divide .* 32 / 3 = 10.6667"),
    (["validation.env=memroy"], r"'validation.env'/'validation.kwargs' .*did you mean 'memory'"),
    (["validation.kwargs={num_symbols: 1}"], r"'validation.kwargs' .*num_symbols=1 is invalid"),
    (["shaping.format_penalty=0.1"], r"'shaping.format_penalty'=0.1 must be <= 0"),
    (["envs=[{name: memroy, groups: 32}]"], r"'envs\[0\].name'/.*did you mean 'memory'"),
    (["envs=[{groups: 32}]"], r"'envs\[0\].name' is required"),
    (["envs=[{name: memory, grups: 32}]"], r"unknown config key 'envs\[0\].grups'; did you mean"),
    (["envs=[{name: memory, groups: 0}]"], r"'envs\[0\].groups'=0 is invalid"),
    (
      ["envs=[{name: memory, groups: 4}, {name: stash, groups: 3}]", "ppo.num_generations=4"],
      r"'envs': 4 \+ 3 = 7 groups x 4 episodes = 28 episodes, but a batch holds 32 .* 32 / 4 = 8",
    ),
    (
      ["envs=[{name: memory, groups: 16}, {name: memory, groups: 16}]"],
      r"'envs\[1\].tag'='memory' is also envs\[0\]'s",
    ),
    (["env.name=stash", "envs=[{name: memory, groups: 32}]"], r"'envs' and 'env.name'.* give one"),
    (["validation.envs=[{name: stash, groups: 3}]"], r"'validation.envs': 3 = 3 groups x 1"),
    (
      ["validation.env=stash", "validation.envs=[{name: stash, groups: 32}]"],
      r"'validation.envs' and 'validation.env'/'validation.kwargs' .* give one",
    ),
    (
      [
        "envs=[{name: memory, groups: 5}, {name: stash, groups: 3}]",
        "ppo.num_generations=4",
        "validation.group_size=8",
      ],
      r"'validation.group_size'=8 must divide envs\[0\]'s 5 x 4 = 20 episodes per batch",
    ),
    (
      [
        "batch.rollout_micro_batch_size=8",
        "batch.logps_micro_batch_size=8",
        "validation.group_size=16",
      ],
      r"'validation.group_size'=16 must divide the evaluation chunk of 8 episodes",
    ),
  ],
)
def test_bad_recipe_settings_name_the_key_and_the_arithmetic(overrides, message):
  with pytest.raises(ValueError, match=message):
    load_run_config(None, overrides)


def test_batch_sizes_reach_tunix_in_prompts():
  run = load_run_config(
    None, ["batch.mini_batch_size=16", "batch.gradient_accumulation_steps=2",
           "batch.rollout_micro_batch_size=8", "batch.logps_micro_batch_size=32"]
  )  # fmt: skip
  plan = recipe.resolve_batch(run.batch, run.train.batch_size, 4)
  assert plan.tunix_sizes == {
    "mini_batch_size": 4,
    "train_micro_batch_size": 2,
    "rollout_micro_batch_size": 2,
    "logps_micro_batch_size": 8,
  }
  assert (plan.mini_batch_size, plan.train_micro_batch_size, plan.accumulation) == (16, 8, 2)
  assert plan.rollout_chunk == 32 and plan.logps_micro_batch_size == 32
  assert plan.updates_per_epoch == run.train.batch_size // 16


def test_an_empty_batch_section_is_filled_with_tunix_s_defaults_and_passes_none():
  plan = recipe.resolve_batch(recipe.BatchSection(), 32, 4)
  assert plan.tunix_sizes == {}  # tunix's own defaults (they decide how it logs a step)
  assert plan == recipe.BatchPlan(32, 32, 32, 32, 32, 32, None, {})
  only_rollout = recipe.resolve_batch(recipe.BatchSection(rollout_micro_batch_size=8), 32, 4)
  # tunix's chunk: lcm(rollout 8, log-prob micro-batch = train micro-batch 32); passes: chunk
  assert (only_rollout.rollout_chunk, only_rollout.logps_micro_batch_size) == (32, 32)
  assert only_rollout.tunix_sizes == {"rollout_micro_batch_size": 2}


STEPS = 4
RECIPE = [
  f"train.steps={STEPS}",
  "train.eval_every=2",
  "optim.actor.name=adamw",
  "optim.actor.weight_decay=0.01",
  "optim.actor.clip_grad_norm=1.0",
  "optim.actor.schedule=linear",
  "optim.actor.warmup_steps=2",
  "optim.actor.min_lr_ratio=0.0",  # the section's default decays to a tenth
  "optim.critic.schedule=cosine",
  "optim.critic.min_lr_ratio=0.1",
  "sampling.eval_temperature=0.5",
  "train.batch_size=16",
  "ppo.num_generations=2",
  "batch.mini_batch_size=8",  # of 16 episodes: two updates per rollout batch
  "batch.gradient_accumulation_steps=2",  # rollout chunks of 4 episodes = 2 groups
  "filter.keep_ratio=0.5",  # the group with the larger score spread of each chunk
  "shaping.grouping=batch",
  "shaping.method=mean",
]


def test_a_warm_up_as_long_as_the_run_is_pointed_out():
  with pytest.warns(UserWarning, match=r"optim.critic.warmup_steps=5 is not below train.steps=5"):
    load_run_config(None, ["train.steps=5", "optim.critic.warmup_steps=5"])


def test_a_short_run_shows_the_schedules_the_batching_and_the_eval_temperature(tmp_path):
  resolved = load_resolved(str(SMOKE), [f"output_dir={tmp_path}", "wandb=disabled", *RECIPE])
  run = resolved.run
  summary = job.train(resolved)
  rows = {r["step"]: r for r in read_jsonl(tmp_path / "metrics.jsonl")}
  # tunix's steps are optimizer updates: 4 updates are 2 rollout batches of 2 mini-batches
  assert summary["steps"] == STEPS // 2
  # one step axis: each batch's keys at the first update that trains on it
  assert sorted(s for s, r in rows.items() if "train/return/mean" in r) == [1, 3]
  assert sorted(s for s, r in rows.items() if "actor/pg_loss" in r) == list(range(1, STEPS + 1))
  lr, critic_lr = run.train.lr, run.train.critic_lr
  for step in range(1, STEPS + 1):
    # tunix 0.1.7 writes a step's trainer metrics after the next update and reads the
    # learning rate then: step s shows update s's rate (0-based), the last step its own.
    update = min(step, STEPS - 1)
    actor = reference_lr("linear", lr, STEPS, 2, 0.0, update)
    critic = reference_lr("cosine", critic_lr, STEPS, 0, 0.1, update)
    assert rows[step]["actor/lr"] == pytest.approx(actor, rel=1e-5), step
    assert rows[step]["critic/lr"] == pytest.approx(critic, rel=1e-5), step
    assert math.isfinite(rows[step]["actor/grad_norm"])
  assert len({rows[s]["actor/lr"] for s in range(1, STEPS + 1)}) == 2  # warm-up, then decay
  assert len({rows[s]["critic/lr"] for s in range(1, STEPS + 1)}) == 3
  for step in (1, 3):  # half the groups train; the kept ones spread at least as much
    assert rows[step]["rollout/filter_kept_frac"] == 0.5
    assert rows[step]["rollout/kept_in_group_std"] >= rows[step]["rollout/in_group_std"]
  # the sampler's log-probs are at its temperature, the trainer's at train.temperature (1).
  # The evaluation at step 0 comes before any update, so sampler and trainer hold the same
  # weights and only the temperature separates them (at 1 the gap is ~1e-7); later
  # training mini-batches are sampled before the step's weight sync, so not compared.
  assert rows[0]["eval/rollout/logprob_diff"] > 0.1, rows[0]
  # scores centred on the batch before the estimator: their mean is 0 whatever the returns
  for step in (1, 3):
    assert abs(rows[step]["train/score/mean"]) < 1e-6, rows[step]
    returns = rows[step]["train/episode_return/max"] - rows[step]["train/episode_return/min"]
    spread = rows[step]["train/score/max"] - rows[step]["train/score/min"]
    assert spread <= returns + 1e-6  # centring within each rollout chunk never widens it


def test_validation_plays_its_own_environment_seeds_and_groups(tmp_path):
  overrides = ["validation.kwargs={num_symbols: 2}", "validation.seed=123"]
  overrides += ["validation.group_size=1", "wandb=disabled", f"output_dir={tmp_path}"]
  run = load_run_config(str(SMOKE), overrides)
  learner, _, eval_batches, _ = job.build_run(run, tmp_path)
  generations = run.ppo.get("num_generations", 1)
  data = {k: np.repeat(v, generations, axis=0) for k, v in eval_batches[0].items()}
  # tunix's cluster buffers an evaluation metric only after a training one (IndexError
  # otherwise); in a run the training batch is always prepared first
  learner.rl_cluster.buffer_metrics({"timing_s/step": (0.0, np.mean)}, mode=Mode.TRAIN)
  batch = learner.trajectory_source(learner, data, Mode.EVAL)
  learner.rl_cluster.close()
  seeds = recipe.validation_seeds(run.validation, run.train.batch_size, 1)
  assert len(set(seeds.tolist())) == len(set(batch.group_ids.tolist())) == run.train.batch_size
  tokenizer = learner.rl_cluster.tokenizer
  special = {tokenizer.pad_id(), tokenizer.bos_id()}
  prompts = [tokenizer.decode([t for t in row if t not in special]) for row in batch.prompt_ids]
  validation = [MemoryEnv(num_symbols=2).reset(int(s))[0] for s in seeds]
  assert prompts == validation
  assert prompts != [MemoryEnv().reset(int(s))[0] for s in seeds]  # not training's env


MIXED = [
  "train.steps=2",
  "train.batch_size=8",
  "ppo.num_generations=2",
  "model.alphabet='abcehikstw!?. #gBpPldru'",  # memory's, sokoban's and stash's characters
  "train.max_prompt_length=24",
  "env.max_turns=3",
  "env.max_completion_len=48",
  "envs=[{name: memory, groups: 2}, {name: sokoban, groups: 2, kwargs: {max_steps: 3}}]",
  "shaping.format_penalty=-0.5",
  "validation.envs=[{name: sokoban, groups: 4, tag: sokoban_val, kwargs: {max_steps: 3}},"
  " {name: stash, groups: 4}]",
  "validation.group_size=1",
  "validation.seed=7",
  "train.eval_samples=8",  # every evaluation episode to samples.jsonl: the reference below
]


def test_a_mixed_run_reports_each_environment_and_the_format_penalty(tmp_path):
  resolved = load_resolved(str(SMOKE), [f"output_dir={tmp_path}", "wandb=disabled", *MIXED])
  run = resolved.run
  summary = job.train(resolved)
  rows = {r["step"]: r for r in read_jsonl(tmp_path / "metrics.jsonl")}
  sokoban_max = SokobanEnv(max_steps=3).max_return
  assert summary["max_return"] == pytest.approx((MemoryEnv().max_return + sokoban_max) / 2)
  for step in (1, 2):  # both environments in every batch, each with its own metrics
    row = rows[step]
    mine = [row[f"train/env/{tag}/episode_return"] for tag in ("memory", "sokoban")]
    assert row["train/episode_return/mean"] == pytest.approx(np.mean(mine), abs=1e-6)
    assert 0.0 <= row["train/env/memory/success_rate"] <= 1.0
    assert 0.0 <= row["train/env/sokoban/invalid_action"] <= 1.0
    assert "train/env/memory/invalid_action" not in row  # memory reports no such thing
    # the penalty: -0.5 per malformed turn, on top of the environments' returns
    assert row["rollout/format_penalty"] == pytest.approx(-0.5 * row["rollout/malformed_turns"])
    shaped = row["train/episode_return/mean"] + row["rollout/format_penalty"]
    assert row["train/score/mean"] == pytest.approx(shaped, abs=1e-5)
  assert rows[1]["rollout/malformed_turns"] > 0  # the untrained model's sokoban replies
  # evaluation plays the validation environments only, on its own seeds
  evaluation = rows[0]
  assert {k for k in evaluation if k.startswith("eval/env/")} >= {
    "eval/env/sokoban_val/episode_return",
    "eval/env/stash/episode_return",
    "eval/env/sokoban_val/invalid_action",
  }
  assert not any(k.startswith(("eval/env/memory", "eval/env/sokoban/")) for k in evaluation)
  samples = [s for s in read_samples(tmp_path / "samples.jsonl") if s["step"] == 0]
  assert len(samples) == 8
  assert sum(s["turns"][0]["text"] == "take?" for s in samples) == 4  # stash's groups
  np.testing.assert_array_equal(
    sorted(s["seed"] for s in samples), sorted(recipe.validation_seeds(run.validation, 8, 1))
  )
  moves = ("l", "d", "r", "u")

  def malformed_turns(sample):  # reference: sokoban's replies that are not one of its moves
    if sample["turns"][0]["text"] == "take?":  # stash: never malformed
      return 0
    return sum(t["text"].strip() not in moves for t in sample["turns"] if t["role"] == "agent")

  malformed = [malformed_turns(s) for s in samples]
  returns = [s["return"] for s in samples]
  assert evaluation["eval/rollout/malformed_turns"] == pytest.approx(np.mean(malformed))
  shaped = np.mean(returns) - 0.5 * np.mean(malformed)
  assert evaluation["eval/score/mean"] == pytest.approx(shaped, abs=1e-5)
