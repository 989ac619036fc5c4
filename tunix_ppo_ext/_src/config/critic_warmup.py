"""`CriticWarmup`: value pretraining (VC-PPO, arXiv:2503.01491; VAPO, arXiv:2504.05118).

The first steps of a run train only the critic, on rollouts of the initial policy (the
actor's loss is scaled by 0, and its update skips the policy's backward pass:
`loss_fns.backward_unless_zero`), with value targets of their own lambda (1.0: Monte Carlo
returns). The warm-up lasts `critic_warmup_steps` global steps, or ends earlier after the
first step whose explained variance (the critic's values before that step's update, against
the warm-up's targets) reaches `critic_warmup_until_ev`, or after `critic_warmup_patience`
steps in a row without a new best explained variance (a plateau). Where it ended is part of the
learner's checkpointed state, so a resumed run neither repeats nor skips it.
"""

from __future__ import annotations

from typing import Any


class CriticWarmup:
  """Whether a global step is a warm-up step, and the rule that ends the warm-up."""

  def __init__(self, steps: int, until_ev: float | None, patience: int | None = None):
    self.steps = steps
    self.until_ev = until_ev
    self.patience = patience
    self.ended_at: int | None = None  # the first step after an early end
    self.best: float | None = None  # the best explained variance so far (plateau rule)
    self.since_best = 0  # warm-up steps since it

  def end(self) -> int:
    """The first global step (0-based) that trains the actor."""
    return self.steps if self.ended_at is None else min(self.steps, self.ended_at)

  def active(self, step: int) -> bool:
    """Whether global step `step` (0-based) trains only the critic."""
    return step < self.end()

  def after_rollout(self, step: int, explained_variance: float | None) -> None:
    """Ends the warm-up after `step` when its explained variance reached the target, or
    did not beat the best one for `patience` steps in a row."""
    if explained_variance is None or not self.active(step):
      return
    if self.until_ev is not None and explained_variance >= self.until_ev:
      self.ended_at = step + 1
    if self.best is None or explained_variance > self.best:
      self.best, self.since_best = explained_variance, 0
    else:
      self.since_best += 1
    if self.patience is not None and self.since_best >= self.patience:
      self.ended_at = step + 1

  def metrics(self, step: int) -> dict[str, float]:
    """`critic/warmup` (1 on a warm-up step) and `critic/warmup_steps` (done, this included)."""
    if not self.steps:
      return {}
    done = min(step + 1, self.end())
    return {"learner/critic_warmup": float(self.active(step)), "learner/critic_warmup_steps": done}

  def state_dict(self) -> dict[str, Any]:
    return {
      "ended_at": -1 if self.ended_at is None else self.ended_at,
      "has_best": int(self.best is not None),  # no None, no NaN: orbax's JSON metadata
      "best": 0.0 if self.best is None else float(self.best),
      "since_best": self.since_best,
    }

  def load_state_dict(self, state: dict[str, Any]) -> None:
    ended_at = int(state.get("ended_at", -1))
    self.ended_at = None if ended_at < 0 else ended_at
    self.best = float(state["best"]) if state.get("has_best") else None
    self.since_best = int(state.get("since_best", 0))
