"""Advantage estimators: GAE (multi-turn aware), GRPO / Dr. GRPO, RLOO, REINFORCE++, GiGPO.

Every estimator follows verl's published definitions (`verl/trainer/ppo/core_algos.py`)
token for token, computes in float32 whatever the input dtype, is jit-compiled, and never
produces NaN/inf for empty masks, constant groups or groups of one.

Shapes: `B` sequences (batch), `T` tokens per sequence. Masks are 0/1 arrays (bool, int
or float) of shape `[B, T]`: 1 on tokens the policy generated (agent tokens), 0 on
padding and, in multi-turn trajectories, on environment observation tokens.
"""

from __future__ import annotations

import functools
import numbers

import chex
import jax
import jax.numpy as jnp

from tunix_ppo_ext._src.checks import check_number
from tunix_ppo_ext._src.ops.masked import masked_whiten

__all__ = [
  "compute_gae_advantages",
  "compute_turn_gae_advantages",
  "length_adaptive_lambda",
  "compute_grpo_advantages",
  "compute_reinforce_plus_plus_advantages",
  "compute_rloo_advantages",
  "compute_gigpo_advantages",
]


def _check_unit_interval(name: str, value: object) -> None:
  """Raises ValueError if a concrete python/numpy number is outside [0, 1] (or NaN).

  Traced or array values (e.g. when the caller jits the estimator itself) are not checked.
  """
  if isinstance(value, numbers.Real):
    check_number(name, value, low=0.0, high=1.0)


def _f32(x: jax.Array) -> jax.Array:
  return jnp.asarray(x).astype(jnp.float32)


# ------------------------------------------------------------------------------------
# GAE
# ------------------------------------------------------------------------------------


def _on_agent_tokens(raw: jax.Array, mask: jax.Array, whiten: bool) -> jax.Array:
  """The advantages `raw`, whitened over the mask when `whiten`, zero off the mask."""
  return (masked_whiten(raw, mask) if whiten else raw) * mask


@functools.partial(jax.jit, static_argnames=("whiten",))
def _gae(
  rewards: jax.Array,
  values: jax.Array,
  mask: jax.Array,
  gamma: jax.Array | float,
  gae_lambda: jax.Array | float,
  whiten: bool,
  gamma_turn: jax.Array | float | None = None,
) -> tuple[jax.Array, jax.Array]:
  chex.assert_rank([rewards, values, mask], 2)
  chex.assert_equal_shape([rewards, values, mask])
  rewards, values, mask = _f32(rewards), _f32(values), _f32(mask)
  gamma = jnp.asarray(gamma, jnp.float32)
  gamma_turn = gamma if gamma_turn is None else jnp.asarray(gamma_turn, jnp.float32)
  gae_lambda = jnp.asarray(gae_lambda, jnp.float32)  # a scalar or one per row, [B]
  batch = rewards.shape[0]

  def step(carry, xs):
    next_value, last_gae, crossed = carry
    r_t, v_t, m_t = xs
    discount = jnp.where(crossed, gamma_turn, gamma)  # gamma_turn across an observation
    delta = r_t + discount * next_value - v_t
    gae_t = delta + discount * gae_lambda * last_gae
    # mask == 0: skip the step, carry next value and running advantage unchanged.
    agent = m_t > 0
    next_value = jnp.where(agent, v_t, next_value)
    last_gae = jnp.where(agent, gae_t, last_gae)
    return (next_value, last_gae, ~agent), last_gae

  zeros = jnp.zeros((batch,), jnp.float32)
  init = (zeros, zeros, jnp.zeros((batch,), jnp.bool_))
  _, raw_t = jax.lax.scan(step, init, (rewards.T, values.T, mask.T), reverse=True)
  raw = raw_t.T
  returns = jnp.where(mask > 0, raw + values, 0.0)
  return _on_agent_tokens(raw, mask, whiten), returns


def compute_gae_advantages(
  rewards: jax.Array,
  values: jax.Array,
  mask: jax.Array,
  gamma: float | jax.Array,
  gae_lambda: float | jax.Array,
  whiten: bool = True,
  gamma_turn: float | jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Multi-turn GAE over token-level rewards (verl `compute_gae_advantage_return`).

  Reverse scan over T. Where `mask[:, t] == 1`: `delta = r_t + g * V_next - v_t`,
  `A_t = delta + g * lambda * A_next`, `V_next = v_t`, with `g = gamma` inside a turn and
  `g = gamma_turn` from a turn's last agent token to the next turn's first (the step that
  crosses an observation; `None`: `gamma`, verl's form). Where `mask[:, t] == 0`
  (observation tokens, padding) the step is skipped: `V_next` and `A_next` are carried
  across unchanged, so rewards and values at masked positions never affect the result.
  `returns = A + values` (raw, unwhitened A). With `whiten`, `A` is whitened with the
  masked mean and unbiased masked variance over the whole batch (`_masked.masked_whiten`).
  A discount per turn beside token-level GAE inside each turn is the bi-level form of
  RAGEN (Wang et al. 2025, arXiv:2504.20073, `high_level_gamma`).
  Ref: Schulman et al. 2015 (arXiv:1506.02438); verl core_algos (multi-turn masking).

  Args:
    rewards: `[B, T]` token-level rewards, any float dtype.
    values: `[B, T]` the critic's values, any float dtype.
    mask: `[B, T]` 0/1 loss mask, any dtype.
    gamma: the discount inside a turn, in [0, 1] (ValueError for python numbers out of
      range).
    gae_lambda: GAE's lambda, in [0, 1], or one value per row, `[B]`
      (`length_adaptive_lambda`).
    whiten: whiten the advantages (static).
    gamma_turn: the discount across an observation, in [0, 1]; None: `gamma`.

  Returns:
    `(advantages, returns)`, float32 `[B, T]`. Both are exactly 0 where `mask == 0`
    (verl leaves whatever the carry/whitening produced there; we zero it so nothing leaks).

  Examples:
    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> from tunix_ppo_ext import ops
    >>> rewards = jnp.array([[0.0, 0.0, 0.0, 1.0]])
    >>> values = jnp.array([[0.5, 9.0, 0.5, 0.5]])  # token 1 is an observation: skipped
    >>> mask = jnp.array([[1, 0, 1, 1]])
    >>> adv, ret = ops.compute_gae_advantages(rewards, values, mask, 1.0, 1.0, whiten=False)
    >>> print(np.round(adv, 4), np.round(ret, 4))
    [[0.5 0.  0.5 0.5]] [[1. 0. 1. 1.]]
  """
  _check_unit_interval("gamma", gamma)
  _check_unit_interval("gae_lambda", gae_lambda)
  _check_unit_interval("gamma_turn", gamma_turn)
  return _gae(rewards, values, mask, gamma, gae_lambda, whiten, gamma_turn)


@jax.jit
def length_adaptive_lambda(mask: jax.Array, alpha: float | jax.Array) -> jax.Array:
  """VAPO's length-adaptive GAE lambda of the policy, one per row (Yue et al. 2025,
  arXiv:2504.05118, eq. 8): `lambda = 1 - 1 / (alpha * l)`, `l` the row's agent tokens,
  clipped to [0, 1] (a row shorter than `1 / alpha` tokens gets 0, an empty row 0).

  Args:
    mask: `[B, T]` 0/1 loss mask.
    alpha: the length scale, > 0 (VAPO: 0.05).

  Returns:
    float32 `[B]`.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tunix_ppo_ext import ops
    >>> ops.length_adaptive_lambda(jnp.array([[1, 1, 1, 1], [1, 1, 0, 0]]), 0.5).tolist()
    [0.5, 0.0]
  """
  length = jnp.sum(_f32(mask) > 0, axis=-1).astype(jnp.float32)
  scaled = jnp.asarray(alpha, jnp.float32) * length
  lam = 1.0 - 1.0 / jnp.where(scaled > 0, scaled, 1.0)
  return jnp.clip(jnp.where(scaled > 0, lam, 0.0), 0.0, 1.0)


def turn_ids(mask: jax.Array) -> jax.Array:
  """`[B, T]` int32: the agent turn of each agent token (0, 1, ...: maximal runs of
  `mask == 1`), `T` (out of range) at masked positions."""
  agent = mask > 0
  before = jnp.pad(agent[:, :-1], ((0, 0), (1, 0)))
  starts = jnp.cumsum(agent & ~before, axis=-1) - 1
  return jnp.where(agent, starts, mask.shape[1]).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("whiten",))
def _turn_gae(rewards, values, mask, gamma_turn, gae_lambda, whiten):
  chex.assert_rank([rewards, values, mask], 2)
  chex.assert_equal_shape([rewards, values, mask])
  rewards, values, mask = _f32(rewards), _f32(values), _f32(mask)
  batch, width = mask.shape
  turn = turn_ids(mask)
  rows = jnp.arange(batch)[:, None]
  agent = mask > 0
  first = agent & (turn != jnp.pad(turn[:, :-1], ((0, 0), (1, 0)), constant_values=-1))
  # per turn: summed agent-token rewards, the value read at the turn's first token
  turn_rewards = jnp.zeros((batch, width + 1)).at[rows, turn].add(jnp.where(agent, rewards, 0.0))
  turn_values = jnp.zeros((batch, width + 1)).at[rows, turn].add(jnp.where(first, values, 0.0))
  turn_mask = jnp.zeros((batch, width + 1)).at[rows, turn].max(agent.astype(jnp.float32))
  turn_adv, _ = _gae(
    turn_rewards[:, :width],
    turn_values[:, :width],
    turn_mask[:, :width],
    gamma_turn,
    gae_lambda,
    False,
  )
  turn_adv = jnp.pad(turn_adv, ((0, 0), (0, 1)))
  raw = jnp.take_along_axis(turn_adv, turn, axis=-1) * mask
  returns = jnp.where(agent, raw + jnp.take_along_axis(turn_values, turn, axis=-1), 0.0)
  return _on_agent_tokens(raw, mask, whiten), returns


def compute_turn_gae_advantages(
  rewards: jax.Array,
  values: jax.Array,
  mask: jax.Array,
  gamma_turn: float | jax.Array,
  gae_lambda: float | jax.Array,
  whiten: bool = True,
) -> tuple[jax.Array, jax.Array]:
  """Turn-level GAE: each agent turn (a maximal run of `mask == 1`) is one step.

  Turn `k` of a row: reward `R_k`, the sum of its agent tokens' rewards; value `V_k`, the
  critic's value at its first agent token (the state after the observation that opened it).
  Reverse over turns: `delta_k = R_k + gamma_turn * V_{k+1} - V_k`, `A_k = delta_k +
  gamma_turn * lambda * A_{k+1}`, with `V_K = A_K = 0` after the last turn; every token of
  turn `k` gets advantage `A_k` and value target `A_k + V_k`. With `whiten`, advantages are
  whitened over the mask as in `compute_gae_advantages`. Turn-level credit as in Turn-PPO
  (arXiv:2512.17008) and RAGEN (arXiv:2504.20073); GAE from Schulman et al. 2015.

  Args:
    rewards: `[B, T]` token-level rewards; those off the mask are ignored.
    values: `[B, T]` the critic's values; only each turn's first agent token's is read.
    mask: `[B, T]` 0/1 loss mask.
    gamma_turn: the discount per turn, in [0, 1].
    gae_lambda: lambda per turn, in [0, 1] (or one per row, `[B]`).
    whiten: whiten the advantages (static).

  Returns:
    `(advantages, returns)`, float32 `[B, T]`, both 0 where `mask == 0`.

  Examples:
    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> from tunix_ppo_ext import ops
    >>> rewards = jnp.array([[0.0, 0.0, 0.0, 0.0, 1.0]])  # two turns: tokens 0-1 and 3-4
    >>> values = jnp.array([[0.25, 0.0, 0.0, 0.5, 0.0]])  # read at each turn's first token
    >>> mask = jnp.array([[1, 1, 0, 1, 1]])
    >>> adv, ret = ops.compute_turn_gae_advantages(rewards, values, mask, 0.5, 1.0, whiten=False)
    >>> print(np.round(adv, 4), np.round(ret, 4))
    [[0.25 0.25 0.   0.5  0.5 ]] [[0.5 0.5 0.  1.  1. ]]
  """
  _check_unit_interval("gamma_turn", gamma_turn)
  _check_unit_interval("gae_lambda", gae_lambda)
  return _turn_gae(rewards, values, mask, gamma_turn, gae_lambda, whiten)


# ------------------------------------------------------------------------------------
# Group-relative outcome estimators
# ------------------------------------------------------------------------------------


def _group_stats(scores: jax.Array, group_ids: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Per-sequence `(count, deviation from group mean, sample variance)`, all `[B]` float32.

  Groups are found with `jnp.unique(size=B)` so arbitrary, non-contiguous integer ids jit.
  Deviations are computed around a per-group pivot (the group max) so a constant group gets
  deviation exactly 0 instead of float32 round-off from `sum / n`.
  """
  num = scores.shape[0]
  _, dense = jnp.unique(group_ids, size=num, return_inverse=True)
  dense = dense.reshape(num)
  count = jax.ops.segment_sum(jnp.ones_like(scores), dense, num_segments=num)[dense]
  pivot = jax.ops.segment_max(scores, dense, num_segments=num)[dense]
  shifted = scores - pivot
  shifted_mean = jax.ops.segment_sum(shifted, dense, num_segments=num)[dense] / count
  dev = shifted - shifted_mean
  sq = jax.ops.segment_sum(jnp.square(dev), dense, num_segments=num)[dense]
  var = sq / jnp.maximum(count - 1.0, 1.0)
  return count, dev, var


def _check_group_inputs(scores: jax.Array, group_ids: jax.Array, mask: jax.Array) -> None:
  chex.assert_rank([scores, group_ids, mask], [1, 1, 2])
  chex.assert_equal_shape_prefix([scores, group_ids, mask], 1)
  chex.assert_type(group_ids, int)


@functools.partial(jax.jit, static_argnames=("norm_by_std",))
def compute_grpo_advantages(
  scores: jax.Array,
  group_ids: jax.Array,
  mask: jax.Array,
  norm_by_std: bool = True,
  epsilon: float | jax.Array = 1e-6,
) -> jax.Array:
  """GRPO outcome advantage (verl `compute_grpo_outcome_advantage`).

  Per group g: `a_i = (s_i - mean_g) / (std_g + epsilon)` with sample std (ddof=1), or
  `a_i = s_i - mean_g` when `norm_by_std=False` (Dr. GRPO, arXiv:2503.20783). A group of one
  uses mean 0 and std 1 as in verl (`s / (1 + eps)`, resp. `s`). Ref: DeepSeekMath
  (arXiv:2402.03300).

  Args:
    scores: `[B]` per-sequence scores (any float dtype).
    group_ids: `[B]` integer ids; groups need not be contiguous, ids are arbitrary.
    mask: `[B, T]` 0/1 response mask.
    norm_by_std: divide by the group std (static).
    epsilon: added to the std.

  Returns:
    float32 `[B, T]`: `a[:, None] * mask`.

  Examples:
    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> from tunix_ppo_ext import ops
    >>> scores, group_ids = jnp.array([1.0, 0.0, 0.0, 1.0]), jnp.array([0, 0, 0, 7])
    >>> mask = jnp.array([[1, 1], [1, 1], [1, 0], [1, 1]])
    >>> print(np.round(np.asarray(ops.compute_grpo_advantages(scores, group_ids, mask)), 4))
    [[ 1.1547  1.1547]
     [-0.5773 -0.5773]
     [-0.5773 -0.    ]
     [ 1.      1.    ]]
  """
  _check_group_inputs(scores, group_ids, mask)
  adv = _group_relative(_f32(scores), group_ids, norm_by_std, epsilon)
  return adv[:, None] * _f32(mask)


def _group_relative(
  scores: jax.Array, group_ids: jax.Array, norm_by_std: bool, epsilon: float | jax.Array
) -> jax.Array:
  """`[B]` GRPO's per-row advantage: the score minus its group's mean, divided by the
  group's sample std + `epsilon` with `norm_by_std`; a group of one keeps its score (mean
  0, std 1, as verl)."""
  count, dev, var = _group_stats(scores, group_ids)
  single = count < 2
  centered = jnp.where(single, scores, dev)
  if not norm_by_std:
    return centered
  std = jnp.where(single, 1.0, jnp.sqrt(var))
  return centered / (std + jnp.asarray(epsilon, jnp.float32))


@jax.jit
def compute_rloo_advantages(scores: jax.Array, group_ids: jax.Array, mask: jax.Array) -> jax.Array:
  """RLOO advantage (verl `compute_rloo_outcome_advantage`), arXiv:2402.14740.

  Per group of size `n > 1`: `a_i = s_i * n/(n-1) - mean * n/(n-1)`, i.e. `s_i` minus the
  mean of the other `n - 1` scores; a group of one keeps its score (`a_i = s_i`).

  Args:
    scores: `[B]` per-sequence scores (any float dtype).
    group_ids: `[B]` integer ids (arbitrary, need not be contiguous).
    mask: `[B, T]` 0/1 response mask.

  Returns:
    float32 `[B, T]`: `a[:, None] * mask`.

  Examples:
    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> from tunix_ppo_ext import ops
    >>> scores, group_ids = jnp.array([1.0, 0.0, 0.0, 1.0]), jnp.array([0, 0, 0, 7])
    >>> mask = jnp.ones((4, 1))
    >>> print(np.round(ops.compute_rloo_advantages(scores, group_ids, mask), 4))
    [[ 1. ]
     [-0.5]
     [-0.5]
     [ 1. ]]
  """
  _check_group_inputs(scores, group_ids, mask)
  scores = _f32(scores)
  count, dev, _ = _group_stats(scores, group_ids)
  adv = jnp.where(count > 1, dev * count / jnp.maximum(count - 1.0, 1.0), scores)
  return adv[:, None] * _f32(mask)


# ------------------------------------------------------------------------------------
# GiGPO
# ------------------------------------------------------------------------------------


def _turn_returns(rewards: jax.Array, mask: jax.Array, gamma_turn: jax.Array) -> jax.Array:
  """`[B, T + 1]` each agent turn's discounted return `G_k = sum_{j >= k} gamma_turn^(j-k)
  r_j` (`r_j` the sum of turn j's agent-token rewards), by turn index; 0 past the last."""
  batch, width = mask.shape
  turn = turn_ids(mask)
  rows = jnp.arange(batch)[:, None]
  turn_rewards = jnp.zeros((batch, width + 1)).at[rows, turn].add(jnp.where(mask > 0, rewards, 0.0))

  def step(later, r_k):
    g_k = r_k + gamma_turn * later
    return g_k, g_k

  _, returns_t = jax.lax.scan(step, jnp.zeros((batch,)), turn_rewards.T, reverse=True)
  return returns_t.T


def _step_groups(group_ids: jax.Array, anchor_ids: jax.Array, played: jax.Array) -> jax.Array:
  """`[B * K]` int32 dense ids of the step groups: turns of one episode group with equal
  anchors; a turn not played is a group of its own."""
  batch, turns = anchor_ids.shape
  size = batch * turns
  _, group = jnp.unique(group_ids, size=batch, return_inverse=True)
  _, anchor = jnp.unique(anchor_ids.reshape(-1), size=size, return_inverse=True)
  pair = jnp.repeat(group.reshape(batch), turns) * size + anchor.reshape(size)
  key = jnp.where(played.reshape(-1), pair, batch * size + jnp.arange(size))
  _, dense = jnp.unique(key, size=size, return_inverse=True)
  return dense.reshape(size)


@functools.partial(jax.jit, static_argnames=("norm_by_std",))
def _gigpo(rewards, mask, group_ids, anchor_ids, gamma_turn, step_weight, norm_by_std, epsilon):
  rewards, mask = _f32(rewards), _f32(mask)
  batch, turns = anchor_ids.shape
  epsilon = jnp.asarray(epsilon, jnp.float32)
  episode = _group_relative(jnp.sum(rewards * mask, axis=-1), group_ids, norm_by_std, epsilon)
  turn = turn_ids(mask)
  returns = _turn_returns(rewards, mask, jnp.asarray(gamma_turn, jnp.float32))
  played = jnp.zeros((batch, mask.shape[1] + 1), jnp.bool_).at[jnp.arange(batch)[:, None], turn]
  played = played.set(mask > 0)[:, :turns]
  padded = jnp.pad(returns, ((0, 0), (0, max(0, turns - returns.shape[1]))))[:, :turns]
  count, dev, var = _group_stats(padded.reshape(-1), _step_groups(group_ids, anchor_ids, played))
  step = dev / (jnp.sqrt(var) + epsilon) if norm_by_std else dev
  step = jnp.where(count > 1, step, 0.0).reshape(batch, turns)
  # tokens of turn k get step[k]; turns past K (and masked tokens) none
  per_token = jnp.take_along_axis(jnp.pad(step, ((0, 0), (0, 1))), jnp.minimum(turn, turns), -1)
  step_weight = jnp.asarray(step_weight, jnp.float32)
  return jnp.where(mask > 0, episode[:, None] + step_weight * per_token, 0.0)


def compute_gigpo_advantages(
  rewards: jax.Array,
  mask: jax.Array,
  group_ids: jax.Array,
  anchor_ids: jax.Array,
  gamma_turn: float | jax.Array = 1.0,
  step_weight: float | jax.Array = 1.0,
  norm_by_std: bool = False,
  epsilon: float | jax.Array = 1e-6,
) -> jax.Array:
  """GiGPO's advantage: an episode-level group advantage plus a step-level one from the
  turns of a group that reached the same anchor state (Feng et al. 2025, "Group-in-Group
  Policy Optimization for LLM Agent Training", arXiv:2505.10978, eqs. 3 and 5-8;
  verl-agent's `compute_gigpo_outcome_advantage`).

  Episode part (eq. 3), per row `i` of group `g`: `A^E_i = (R_i - mean_g R) / F`, `R_i`
  the row's score (the sum of its agent-token rewards), `F` the group's sample std +
  `epsilon` with `norm_by_std`, else 1; a group of one keeps its score (as
  `compute_grpo_advantages`). Step part (eqs. 5-7): turn `k` of row `i` (the k-th maximal
  run of `mask == 1`) has the discounted return `G_ik = sum_{j >= k} gamma_turn^(j-k)
  r_ij` (`r_ij` the sum of turn j's agent-token rewards); its step group is every turn of
  the same episode group whose anchor (`anchor_ids[i, k]`) is equal, and `A^S_ik = (G_ik -
  mean G) / F` over that step group, `F` its sample std + `epsilon` with `norm_by_std`; a
  step group of one gets 0 (no other episode saw that state: verl-agent's
  `step_norm_reward` gives it its return instead). Eq. 8: every token of turn `k` gets
  `A^E_i + step_weight * A^S_ik`; 0 off the mask. Turns past the `K` anchors of a row get
  only the episode part.

  Args:
    rewards: `[B, T]` token-level rewards (any float dtype); those off the mask are ignored.
    mask: `[B, T]` 0/1 loss mask (agent tokens).
    group_ids: `[B]` integer episode groups (arbitrary ids, need not be contiguous).
    anchor_ids: `[B, K]` integers: the anchor state of each row's k-th agent turn (the
      state its observation left); equal ids in one group are one state. Turns not played
      may hold anything. `B * K * B` must stay below 2^31.
    gamma_turn: the discount per turn, in [0, 1].
    step_weight: the step part's weight `omega`, >= 0.
    norm_by_std: divide both parts by their group's std (static; the paper's
      `mean_std_norm`; False: `mean_norm`).
    epsilon: added to each std.

  Returns:
    float32 `[B, T]`.

  Examples:
    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> from tunix_ppo_ext import ops
    >>> rewards = jnp.array([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])  # two turns: token 0, token 2
    >>> mask = jnp.array([[1, 0, 1], [1, 0, 1]])
    >>> anchors = jnp.array([[0, 5], [0, 5]])  # both rows saw the same two states
    >>> adv = ops.compute_gigpo_advantages(rewards, mask, jnp.array([0, 0]), anchors)
    >>> print(np.round(adv, 4))
    [[ 1.  0.  1.]
     [-1.  0. -1.]]
  """
  _check_unit_interval("gamma_turn", gamma_turn)
  if isinstance(step_weight, numbers.Real):
    check_number("step_weight", step_weight, low=0.0)
  chex.assert_rank([rewards, mask, group_ids, anchor_ids], [2, 2, 1, 2])
  chex.assert_equal_shape([rewards, mask])
  chex.assert_equal_shape_prefix([rewards, group_ids, anchor_ids], 1)
  chex.assert_type([group_ids, anchor_ids], int)
  return _gigpo(rewards, mask, group_ids, anchor_ids, gamma_turn, step_weight, norm_by_std, epsilon)


# ------------------------------------------------------------------------------------
# REINFORCE++
# ------------------------------------------------------------------------------------


@jax.jit
def _reinforce_plus_plus(
  rewards: jax.Array, mask: jax.Array, gamma: jax.Array | float
) -> tuple[jax.Array, jax.Array]:
  chex.assert_rank([rewards, mask], 2)
  chex.assert_equal_shape([rewards, mask])
  rewards, mask = _f32(rewards), _f32(mask)
  gamma = jnp.asarray(gamma, jnp.float32)

  def step(running, xs):
    r_t, m_t = xs
    agent = m_t > 0  # mask == 0 (observation, padding): skipped, the return carried across
    running = jnp.where(agent, r_t + gamma * running, running)
    return running, jnp.where(agent, running, 0.0)

  init = jnp.zeros((rewards.shape[0],), jnp.float32)
  _, returns_t = jax.lax.scan(step, init, (rewards.T, mask.T), reverse=True)
  returns = returns_t.T
  return masked_whiten(returns, mask) * mask, returns


def compute_reinforce_plus_plus_advantages(
  rewards: jax.Array, mask: jax.Array, gamma: float | jax.Array
) -> tuple[jax.Array, jax.Array]:
  """REINFORCE++ (verl `compute_reinforce_plus_plus_outcome_advantage`, arXiv:2501.03262),
  over the agent tokens of multi-turn rows.

  Reverse over T, agent tokens only (`mask == 1`): `R = r_t + gamma * R; returns[:, t] =
  R`; positions with `mask == 0` are skipped (their rewards ignored, `R` carried across
  them), as GAE skips them. `advantages = masked_whiten(returns, mask) * mask` (batch-wide
  masked mean, unbiased masked variance). verl's recursion instead restarts `R` from 0 at
  every masked position; on verl's single-turn rows (agent tokens, then padding) the two
  agree on every agent token, but in a multi-turn row verl's would end each turn's return
  at that turn, so no reward would reach an earlier turn.

  Args:
    rewards: `[B, T]` token-level rewards (any float dtype).
    mask: `[B, T]` 0/1 loss mask.
    gamma: discount per agent token, in [0, 1] (ValueError for python numbers out of range).

  Returns:
    `(advantages, returns)`, float32 `[B, T]`, both 0 where `mask == 0`.

  Examples:
    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> from tunix_ppo_ext import ops
    >>> rewards = jnp.array([[0.0, 5.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    >>> mask = jnp.array([[1, 0, 1, 1], [1, 1, 0, 0]])  # row 0's reward 5 is off the mask
    >>> adv, ret = ops.compute_reinforce_plus_plus_advantages(rewards, mask, 0.5)
    >>> print(np.round(ret, 4))
    [[0.25 0.   0.5  1.  ]
     [0.   0.   0.   0.  ]]
  """
  _check_unit_interval("gamma", gamma)
  return _reinforce_plus_plus(rewards, mask, gamma)
