"""tunix's PPO learner (`tunix.rl.ppo.ppo_learner`, `tunix.rl.rl_learner`, `tunix.rl.common`).

What tunix 0.1.7 offers no public way to do, each with its reason:

- `LearnerHooks`: the three private hook methods of `PPOLearner` that a learner must
  override (`_generate_and_compute_advantage`, `_num_generations`, `_run_global_step`),
  forwarded to public methods of the same meaning; `_process_accumulated_batches` (tunix's
  merge of the buffered micro-batches, its rollout phase, its split of the example into
  training micro-batches), done as tunix does with the split's sizes passed to the rollout
  phase as an argument (`model.packing` packs each micro-batch on its own).
  `init_learner`: what `PPOLearner.__init__` does before it sets up the trainers
  (`RLLearner.__init__`, the reward check), with or without a critic (tunix's constructor
  refuses a cluster without one; its training loop itself skips a missing critic trainer,
  as for GRPO); it sets the `_use_reward_model` flag tunix's constructor would have set.
  The learner sets up both trainers itself, so nothing is looked up in tunix's
  `function_registry` by name (nor needs registering there).
- learner state: `compute_rewards`, `uses_reward_model`, `rollout_micro_batch_size`,
  `logps_micro_batch_size` (what tunix's learner set up in its constructor, read where
  its own hook would).

What differs between the two tested tunix versions (`tunix_versions`) here:

- `RLLearner.__init__`'s first keyword (`rl_cluster` on 0.1.7, `rl_engine` on main):
  `init_learner` passes the cluster positionally (both versions).
- `PPOLearner.__init__`'s keywords (`rl_cluster`/`ppo_config` on 0.1.7, `rl_engine`/
  `algo_config` on main): `one_of` takes either spelling, as tunix main's
  `alias_init_param` does; main's closure around the actor's loss is not used (the
  learner installs the loss itself with `with_loss_fn`).
- `compute_entropy_from_logits` (tunix's entropy of logits, the tests' reference):
  `tunix.rl.algo_core` on 0.1.7, `tunix.rl.common` on main; imported here from either.
- `tunix_loss_metrics`: the reducer of tunix's own PPO loss metrics (main's `mean_of_means`,
  0.1.7's `np.mean`).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from tunix.rl import algo_core, rl_learner
from tunix.rl import common as tunix_common
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl import utils as rl_utils
from tunix.rl.ppo import ppo_learner

# tunix main (0.1.8) moved it from `tunix.rl.algo_core` (0.1.7) to `tunix.rl.common`.
compute_entropy_from_logits = (
  tunix_common.compute_entropy_from_logits
  if hasattr(tunix_common, "compute_entropy_from_logits")
  else algo_core.compute_entropy_from_logits
)

PINNED: dict[str, tuple[Any, tuple[str, ...]]] = {
  # object the names live on -> (the object, private names used here)
  "tunix.rl.ppo.ppo_learner.PPOLearner": (
    ppo_learner.PPOLearner,
    ("_generate_and_compute_advantage", "_num_generations", "_run_global_step"),
  ),
  "tunix.rl.rl_learner.RLLearner": (
    rl_learner.RLLearner,
    ("_compute_rewards", "_process_accumulated_batches"),
  ),
}
# Instance attributes set in constructors (checked on live objects by the tests).
PINNED_INSTANCE_ATTRIBUTES = {
  "PPOLearner": (
    "_use_reward_model",
    "_rollout_micro_batch_size",
    "_compute_logps_micro_batch_size",
  ),
}


class LearnerHooks(ppo_learner.PPOLearner):
  """`PPOLearner` whose private hooks call public methods a subclass defines.

  - `generate_and_compute_advantage(training_input, mode, chunk_sizes)`: the rollout
    phase; `chunk_sizes` are the rows of each micro-batch tunix slices its example into
    (`_process_accumulated_batches` passes them to tunix's hook, which takes them as a
    keyword; empty when the hook is called without: sizes unknown).
  - `num_generations()`: samples per prompt.
  - `after_global_step(seconds)`: after each of tunix's global steps, with its wall time.
  """

  def _process_accumulated_batches(
    self, micro_batches: list[Any], micro_batch_sizes: list[int], mode: Any
  ) -> list[Any]:
    # tunix's own body (0.1.7 and main alike), the sizes passed to its rollout-phase hook
    if not micro_batches:
      return []
    sizes = tuple(int(n) for n in micro_batch_sizes)
    merged = rl_utils.merge_micro_batches(micro_batches)
    example = self._generate_and_compute_advantage(merged, mode, chunk_sizes=sizes)
    produced, offset = [], 0
    for n in sizes:
      produced.append(rl_utils.get_batch_slice(example, slice(offset, offset + n)))
      offset += n
    return produced

  def _generate_and_compute_advantage(
    self, training_input: Any, mode: Any = None, chunk_sizes: tuple[int, ...] = ()
  ) -> Any:
    mode = rl_cluster_lib.Mode.TRAIN if mode is None else mode
    return self.generate_and_compute_advantage(training_input, mode, chunk_sizes)

  def _num_generations(self) -> int:
    return self.num_generations()

  def _run_global_step(self, *args: Any, **kwargs: Any) -> None:
    start = time.perf_counter()
    super()._run_global_step(*args, **kwargs)
    self.after_global_step(time.perf_counter() - start)

  def generate_and_compute_advantage(
    self, training_input: Any, mode: Any, chunk_sizes: tuple[int, ...] = ()
  ) -> Any:
    raise NotImplementedError

  def num_generations(self) -> int:
    raise NotImplementedError

  def after_global_step(self, seconds: float) -> None:
    del seconds


def init_learner(
  learner: ppo_learner.PPOLearner,
  rl_cluster: rl_cluster_lib.RLCluster,
  ppo_config: Any,
  reward_fns: Any,
  metric_fns: Any,
  data_shuffle_seed: int | None,
) -> None:
  """Initialises `learner` as `PPOLearner.__init__` does before it sets up the trainers.

  tunix's `RLLearner.__init__` (public), then the reward check, as `PPOLearner.__init__`
  does; its critic check and the trainers' setup (losses looked up by name in tunix's
  `function_registry`, inputs, logged metrics) are what is left out: the learner sets
  its trainers up itself, on every cluster.
  """
  rl_learner.RLLearner.__init__(
    learner,
    rl_cluster,  # positional: its keyword is `rl_cluster` on 0.1.7, `rl_engine` on main
    ppo_config,
    reward_fns=reward_fns,
    metric_fns=metric_fns,
    data_shuffle_seed=data_shuffle_seed,
  )
  try:
    reward_model = rl_cluster.inference_worker.get_model("reward")
  except ValueError:
    reward_model = None
  if bool(reward_fns) == bool(reward_model):
    raise ValueError("PPO needs exactly one of `reward_fns` or a reward model in the cluster")
  learner._use_reward_model = bool(reward_model)


def one_of(name: str, value: Any, old_name: str, old_value: Any) -> Any:
  """The one of two spellings of an argument given, as tunix main's `alias_init_param`
  takes them: ValueError for both, TypeError for neither."""
  if value is not None and old_value is not None:
    raise ValueError(f"Cannot specify both '{name}' and '{old_name}'. Please use '{name}' only.")
  if value is None and old_value is None:
    raise TypeError(f"PpoExtLearner() missing required argument: '{name}' (or '{old_name}')")
  return old_value if value is None else value


def compute_rewards(learner: Any, **kwargs: Any) -> Any:
  """tunix's reward-function scores (`RLLearner._compute_rewards`: its reward manager)."""
  return learner._compute_rewards(**kwargs)


def uses_reward_model(learner: Any) -> bool:
  """Whether tunix's learner was built to score with the reward model (no reward fns)."""
  return bool(learner._use_reward_model)


def rollout_micro_batch_size(learner: Any) -> int | None:
  """The rollout micro-batch size tunix's learner derived from its cluster config."""
  return learner._rollout_micro_batch_size


def logps_micro_batch_size(learner: Any) -> int | None:
  """The micro-batch size tunix's learner uses for its log-prob passes."""
  return learner._compute_logps_micro_batch_size


def tunix_loss_metrics(algo_config: Any) -> tuple[dict[str, Any], dict[str, Any]]:
  """`(actor, critic)` metrics to log of tunix's own `ppo` losses, as tunix's `PPOLearner`
  asks its trainers for them, with the reducer of the installed tunix (tunix main's losses
  return weighted metrics, reduced by its `mean_of_means`; 0.1.7's plain arrays, `np.mean`).
  """
  mean = getattr(tunix_common, "mean_of_means", np.mean)
  actor = {"pg_clipfrac": mean}
  if algo_config.epsilon_c is not None:
    actor["pg_clipfrac_lower"] = mean
  if algo_config.entropy_coef is not None and algo_config.entropy_coef > 0.0:
    actor["loss/entropy"] = mean
  return actor, {"vpred_mean": mean, "vf_clipfrac": mean}
