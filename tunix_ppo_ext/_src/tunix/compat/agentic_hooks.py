"""tunix's agentic learner (`tunix.rl.agentic.agentic_rl_learner`).

What tunix offers no public way to do, each with its reason:

- `AgenticHooks`: `AgenticRLLearner` whose abstract hook `_process_results` (the one method
  an algorithm must implement: a group of collected trajectories to `TrainExample`s, called
  by tunix's producer) is forwarded to the public `process_results` of a subclass.
- `agentic_rewards`: the learner's `_compute_rewards` (tunix's reward manager on the
  episodes: the environment's trajectory rewards plus the reward functions; it logs
  `rewards/...` and keeps the step's reward window that tunix's per-step log line reads).
- `sample_each_call_anew`: tunix's agentic loop sends each agent's request alone
  (`_model_call`, one conversation) with the rollout config's one `seed`, and the vanilla
  engine's sampler starts every call from that seed's key: every episode of a group drew
  the same tokens (the same first reply for all of them; no spread for a group estimator,
  no exploration). It wraps the engine's public `generate` on the instance, no private
  name (`tests/tunix/test_agentic_ppo.py` checks that a group's episodes differ).

Both names are on the two tested tunix versions. What differs between them is the
learner's API itself (0.1.7: `rl_cluster`, main: `rl_engine`, with main's `update_critic`
path tested): `needs_main` is the version probe, `AgenticPpoLearner` runs on tunix main only.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.agentic import agentic_rl_learner
from tunix.rl.rollout import vanilla_rollout

PINNED: dict[str, tuple[Any, tuple[str, ...]]] = {
  # object the names live on -> (the object, private names used here)
  "tunix.rl.agentic.agentic_rl_learner.AgenticRLLearner": (
    agentic_rl_learner.AgenticRLLearner,
    ("_process_results", "_compute_rewards"),
  ),
}
# Instance attributes set in constructors (checked on live objects by the tests).
PINNED_INSTANCE_ATTRIBUTES: dict[str, tuple[str, ...]] = {}

MAIN_COMMIT = "c7d8950f"  # the tunix main commit the agentic learner is tested at


class AgenticHooks(agentic_rl_learner.AgenticRLLearner):
  """`AgenticRLLearner` whose private hook calls a public method a subclass defines:
  `process_results(trajectories, mode, expected_step)`, one group's (or, with
  `compute_logps_micro_batch_size > 1`, several groups') trajectories to a list of
  `TrainExample`s."""

  def _process_results(
    self,
    trajectories: list[Any],
    mode: Any = rl_cluster_lib.Mode.TRAIN,
    expected_step: int | None = None,
  ) -> list[Any]:
    return self.process_results(trajectories, mode, expected_step)

  def process_results(self, trajectories: list[Any], mode: Any, expected_step: int | None):
    raise NotImplementedError


def agentic_rewards(learner: Any, **kwargs: Any) -> Any:
  """tunix's agentic reward manager on the episodes (`AgenticRLLearner._compute_rewards`):
  `[B]` scores; it logs the rewards' metrics at `expected_step`."""
  return learner._compute_rewards(**kwargs)


def sample_each_call_anew(engine: Any) -> None:
  """Makes tunix's vanilla engine sample each `generate` call with a key of its own (see
  the module docstring): the `n`th call while the engine's `global_steps` is `k` samples
  with seed `hash((seed, k, n))` (an int seed, or None as 0; a key array a user set is
  left alone). Counted per training step, which tunix checkpoints, so a resumed run draws
  what the uninterrupted one drew. Other engines, and an engine done before, are left as
  they are."""
  rollout = engine.rollout
  if not isinstance(rollout, vanilla_rollout.VanillaRollout) or hasattr(rollout, "_calls"):
    return
  generate, rollout._calls = rollout.generate, {}

  def anew(prompts: Any, rollout_config: Any, **kwargs: Any) -> Any:
    seed = rollout_config.seed
    if seed is None or isinstance(seed, int):
      step = engine.global_steps
      calls = rollout._calls.setdefault(step, itertools.count(1))
      seed = hash((seed or 0, step, next(calls))) % 2**31
      rollout_config = dataclasses.replace(rollout_config, seed=seed)
    return generate(prompts, rollout_config, **kwargs)

  rollout.generate = anew


def needs_main(what: str) -> None:
  """RuntimeError (one line) unless the installed tunix has tunix main's API (`RLEngine`)."""
  if hasattr(rl_cluster_lib, "RLEngine"):
    return
  import importlib.metadata  # noqa: PLC0415

  version = importlib.metadata.version("google-tunix")
  raise RuntimeError(
    f"{what} needs tunix main (google-tunix >= 0.1.8, tested at commit {MAIN_COMMIT}: its "
    f"RLEngine and agentic critic path); the installed google-tunix {version} lacks them"
  )
