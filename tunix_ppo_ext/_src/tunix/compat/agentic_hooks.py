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
  no exploration). It wraps the engine's public `generate` on the instance, applied by
  `patches.prepare(engine, sample_anew=True)` (`tests/tunix/learner/test_agentic_ppo.py` checks
  that a group's episodes differ).
- `AgenticHooks._compute_packed_logps`: the hook tunix's loop calls on each chunk of packed
  rows (`max_seq_token_per_tpu`) before its trainers get it (tunix's agentic GRPO computes
  its deferred log-probs there), forwarded to the public `packed_example`: where
  `AgenticPpoLearner` gives the packed episodes back their padded rows and fields
  (`learner.agentic_packing`).
- `AgenticHooks._model_call`: the call that names the episode (its environment's
  `group_id` and `pair_index`, which tunix numbers from the checkpointed step) and the
  turn (the replies so far in its conversation). tunix runs the episodes concurrently, so
  the order of the calls is not the episodes' order; a key from the episode and turn is
  the same in a resumed run as in an uninterrupted one, a count of calls was not. Its
  `max_generation_steps` (what tunix's collect engine allows the call: the rest of the
  episode's budget) passes through `turn_budget`, where a per-turn cap applies.

The names but `_compute_packed_logps` (tunix main's, pinned there) are on the two tested
tunix versions. What differs between them is the
learner's API itself (0.1.7: `rl_cluster`, main: `rl_engine`, with main's `update_critic`
path tested): `needs_main` is the version probe, `AgenticPpoLearner` runs on tunix main only.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from typing import Any

from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.agentic import agentic_rl_learner
from tunix.rl.rollout import vanilla_rollout

# tunix main's packed path only (0.1.7 has no `_compute_packed_logps` and no packing loop)
PACKING_HOOKS = ("_compute_packed_logps",) if hasattr(rl_cluster_lib, "RLEngine") else ()
PINNED: dict[str, tuple[Any, tuple[str, ...]]] = {
  # object the names live on -> (the object, private names used here)
  "tunix.rl.agentic.agentic_rl_learner.AgenticRLLearner": (
    agentic_rl_learner.AgenticRLLearner,
    ("_process_results", "_compute_rewards", "_model_call", *PACKING_HOOKS),
  ),
}
# Instance attributes set in constructors (checked on live objects by the tests).
PINNED_INSTANCE_ATTRIBUTES: dict[str, tuple[str, ...]] = {}

MAIN_COMMIT = "c7d8950f"  # the tunix main commit the agentic learner is tested at
_CALL = threading.local()  # `.episode`: the (group, pair, turn) of the call on this thread


class AgenticHooks(agentic_rl_learner.AgenticRLLearner):
  """`AgenticRLLearner` whose private hook calls a public method a subclass defines:
  `process_results(trajectories, mode, expected_step)`, one group's (or, with
  `compute_logps_micro_batch_size > 1`, several groups') trajectories to a list of
  `TrainExample`s; each model call's token budget passes through `turn_budget`; and under
  sequence packing each packed chunk tunix trains passes through `packed_example`."""

  def _process_results(
    self,
    trajectories: list[Any],
    mode: Any = rl_cluster_lib.Mode.TRAIN,
    expected_step: int | None = None,
  ) -> list[Any]:
    return self.process_results(trajectories, mode, expected_step)

  def process_results(self, trajectories: list[Any], mode: Any, expected_step: int | None):
    raise NotImplementedError

  def _compute_packed_logps(self, example: Any) -> Any:
    return self.packed_example(example)

  def packed_example(self, example: Any) -> Any:
    """What tunix's loop trains for one chunk of its packed rows (`max_seq_token_per_tpu`);
    tunix's packed `example` itself here."""
    return example

  def turn_budget(self, left: int | None) -> int | None:
    """The most tokens a model call may generate, given `left` (what tunix's loop allows:
    the rest of the episode's `max_response_length`, None without one); `left` itself here."""
    return left

  def _model_call(
    self, chat_lists: list[dict[str, str]], env: Any = None, max_generation_steps: Any = None
  ) -> Any:
    # tunix runs this on an executor thread and calls the engine's `generate` inside it
    _CALL.episode = episode_turn(chat_lists, env)
    try:
      return super()._model_call(chat_lists, env, self.turn_budget(max_generation_steps))
    finally:
      _CALL.episode = None


def episode_turn(chat_lists: list[dict[str, str]], env: Any) -> tuple[int, int, int] | None:
  """`(group_id, pair_index, turn)` of an agentic model call: the ids tunix gives the
  episode's environment and the replies already in its conversation; None for an
  environment without tunix's ids."""
  ids = getattr(env, "extra_kwargs", None) or {}
  if "group_id" not in ids:
    return None
  turn = sum(message.get("role") == "assistant" for message in chat_lists)
  return int(ids["group_id"]), int(ids.get("pair_index", 0)), turn


def agentic_rewards(learner: Any, **kwargs: Any) -> Any:
  """tunix's agentic reward manager on the episodes (`AgenticRLLearner._compute_rewards`):
  `[B]` scores; it logs the rewards' metrics at `expected_step`."""
  return learner._compute_rewards(**kwargs)


def sample_each_call_anew(engine: Any) -> None:
  """Makes tunix's vanilla engine sample each `generate` call with a key of its own (see
  the module docstring): a call of an agentic episode samples with seed
  `hash((seed, group_id, pair_index, turn))`, any other call (no episode ids) with
  `hash((seed, k, n))` for the `n`th such call at training step `k` (an int seed, or None
  as 0; a key array a user set is left alone). Both come back the same in a resumed run.
  Other engines, and an engine done before, are left as they are."""
  rollout = engine.rollout
  if not isinstance(rollout, vanilla_rollout.VanillaRollout) or hasattr(rollout, "_calls"):
    return
  generate, rollout._calls = rollout.generate, {}

  def anew(prompts: Any, rollout_config: Any, **kwargs: Any) -> Any:
    seed = rollout_config.seed
    if seed is None or isinstance(seed, int):
      key = getattr(_CALL, "episode", None)
      if key is None:
        step = engine.global_steps
        key = (step, next(rollout._calls.setdefault(step, itertools.count(1))))
      seed = hash((seed or 0, *key)) % 2**31
      rollout_config = dataclasses.replace(rollout_config, seed=seed)
    return generate(prompts, rollout_config, **kwargs)

  rollout.generate = anew


def needs_main(what: str) -> None:
  """RuntimeError (one line) unless the installed tunix has tunix main's API (`RLEngine`)."""
  if hasattr(rl_cluster_lib, "RLEngine"):
    return
  import importlib.metadata

  version = importlib.metadata.version("google-tunix")
  raise RuntimeError(
    f"{what} needs tunix main (google-tunix >= 0.1.8, tested at commit {MAIN_COMMIT}: its "
    f"RLEngine and agentic critic path); the installed google-tunix {version} lacks them"
  )
