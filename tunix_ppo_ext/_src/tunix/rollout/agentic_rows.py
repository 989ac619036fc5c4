"""tunix's agentic episodes as a `TrajectoryBatch`: the rows `AgenticPpoLearner` trains on.

tunix's trajectory engine (`TrajectoryCollectEngine`, "Token" mode) hands each episode as a
dict: `prompt_tokens`, `conversation_tokens` (the agent's turns and the environment's
observations, in order), `conversation_masks` (1 on the agent's tokens), `old_logprobs`
(the sampler's, 0 on observations), `trajectory_reward`, `status`, `policy_version`,
`original_input`. `agentic_rows` pads them as tunix's agentic GRPO does (prompts left to
the rollout's `max_prompt_length`, episodes right to `max_response_length`, cut there):
`attention_mask` is every real episode token, `loss_mask` the agent's (observations and
tool outputs are attended, never trained), groups are tunix's `group_id`s. Its agent turns
are the runs of the loss mask. Rows come in (group, pair) order, not in the order tunix's
concurrent episodes finished: a positional reward function, a batch's float sums and a
resumed run then see the same rows. `with_scores` puts each episode's score on its last agent
token (tunix's episode engine keeps no per-turn reward in its token rows). Each agent
turn's anchor state (GiGPO's step groups) is the observation it answers: the prompt's
tokens for the first turn, the tokens between the previous turn and it for the others.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
from tunix.rl.agentic import utils as agentic_utils

from tunix_ppo_ext._src.data.trajectory import TrajectoryBatch

# tunix's `TrajectoryStatus` names: cut at the token budget; out of environment steps
TRUNCATED_STATUS = "MAX_CONTEXT_LIMIT_REACHED"
TURN_LIMITED_STATUS = "MAX_STEPS_REACHED"


@dataclasses.dataclass
class AgenticRows:
  """The rows of a batch of tunix episodes.

  Attributes:
    batch: the padded rows (`token_rewards` zero until `with_scores`), group ids set.
    behaviour_logps: `[B, T]` the sampler's log-probs (0 off the loss mask), or None when
      an episode has none (the rollout returned no log-probs).
    policy_versions: `[B]` the policy version each episode was sampled with.
    completions: each episode's first assistant message (what tunix's agentic GRPO hands
      its reward functions).
    trajectory_rewards: `[B]` the environment's summed rewards.
    original_inputs: each episode's task (its dataset row).
  """

  batch: TrajectoryBatch
  behaviour_logps: np.ndarray | None
  policy_versions: np.ndarray
  completions: list[str]
  trajectory_rewards: list[float]
  original_inputs: list[dict[str, Any]]


def first_assistant_text(traj: dict[str, Any]) -> str:
  """The first assistant message of an episode's conversation ('' without one)."""
  for message in traj.get("conversation_text") or []:
    if message["role"] == "assistant":
      return message["content"]
  return ""


def group_indices(group_ids: Sequence[Any]) -> np.ndarray:
  """`[B]` ints, one per distinct group id in order of first appearance."""
  seen: dict[Any, int] = {}
  return np.array([seen.setdefault(g, len(seen)) for g in group_ids], np.int32)


def group_of(item: Any) -> Any:
  """An episode's group: its `TrajectoryItem`'s `group_id`, else its trajectory's."""
  return item.group_id if hasattr(item, "group_id") else item.traj.get("group_id")


def episode_order(item: Any) -> tuple[Any, ...]:
  """A sort key putting episodes in (group, pair) order: int group ids by value, others
  by their repr (any stable order will do); an item without `pair_index` is pair 0."""
  group = group_of(item)
  group_key = (0, group, "") if isinstance(group, int) else (1, 0, repr(group))
  return (*group_key, getattr(item, "pair_index", 0))


def turn_counts(loss_mask: np.ndarray) -> np.ndarray:
  """`[B]` agent turns: the maximal runs of 1 in each row of the loss mask."""
  agent = np.asarray(loss_mask) > 0
  before = np.pad(agent[:, :-1], ((0, 0), (1, 0)))
  return (agent & ~before).sum(-1).astype(np.int32)


def observation_anchors(
  prompt_ids: np.ndarray, completion_ids: np.ndarray, loss_mask: np.ndarray, pad_id: int
) -> np.ndarray:
  """`[B, K]` int32 anchor ids (K the most agent turns of a row, at least 1): turn k's is
  the observation before it (the prompt's real tokens for the first turn, the episode's
  tokens since the previous agent turn for the others); equal observations, one id (as
  verl-agent's anchor observations); -1 where a row played fewer turns."""
  agent = np.asarray(loss_mask) > 0
  turns = max(1, int(turn_counts(agent).max(initial=0)))
  keys: list[list[tuple[int, ...]]] = []
  for prompt, tokens, mask in zip(prompt_ids, completion_ids, agent, strict=True):
    starts = np.flatnonzero(mask & ~np.pad(mask[:-1], (1, 0)))
    ends = np.flatnonzero(mask & ~np.pad(mask[1:], (0, 1))) + 1
    first = tuple(int(t) for t in prompt if t != pad_id)
    between = zip(ends[:-1], starts[1:], strict=True)
    keys.append([first, *(tuple(tokens[e:s].tolist()) for e, s in between)])
  numbers: dict[tuple[int, ...], int] = {}
  out = np.full((len(keys), turns), -1, np.int32)
  for row, observations in enumerate(keys):
    for k in range(len(observations) if agent[row].any() else 0):
      out[row, k] = numbers.setdefault(observations[k], len(numbers))
  return out


def _row(traj: dict[str, Any], prompt_len: int, width: int, pad_id: int) -> dict[str, Any]:
  """One episode padded: prompt, completion, both masks, behaviour log-probs (or None)."""
  tokens = np.asarray(traj.get("conversation_tokens"), np.int32).reshape(-1)
  prompt, completion, _ = agentic_utils.pad_prompt_and_completion(
    traj.get("prompt_tokens"), tokens, prompt_len, width, pad_id
  )
  n = min(len(tokens), width)
  masks = np.asarray(traj.get("conversation_masks"), np.int32).reshape(-1)
  logprobs = traj.get("old_logprobs")
  if logprobs is not None:
    logprobs = agentic_utils.right_pad(np.asarray(logprobs, np.float32), width, 0.0, np.float32)
  return {
    "prompt": prompt,
    "completion": completion[:width],
    "attention": (np.arange(width) < n).astype(np.int32),
    "loss": agentic_utils.right_pad(masks, width, 0)[:width],
    "logprobs": logprobs,
    "truncated": len(tokens) >= width or traj.get("status") == TRUNCATED_STATUS,
    "turn_limited": traj.get("status") == TURN_LIMITED_STATUS,
  }


def agentic_rows(
  items: Sequence[Any], *, max_prompt_length: int, width: int, pad_id: int
) -> AgenticRows:
  """The rows of tunix's `TrajectoryItem`s (module docstring); `width` is the agentic
  config's `max_response_length`."""
  items = sorted(items, key=episode_order)
  trajs = [item.traj for item in items]
  rows = [_row(traj, max_prompt_length, width, pad_id) for traj in trajs]
  stack = lambda key: np.stack([row[key] for row in rows])  # noqa: E731
  loss = stack("loss") * stack("attention")
  logprobs = [row["logprobs"] for row in rows]
  behaviour = None if any(lp is None for lp in logprobs) else np.stack(logprobs) * (loss > 0)
  versions = [traj.get("policy_version") for traj in trajs]
  batch = TrajectoryBatch(
    prompt_ids=stack("prompt"),
    completion_ids=stack("completion"),
    attention_mask=stack("attention"),
    loss_mask=loss,
    token_rewards=np.zeros(loss.shape, np.float32),
    group_ids=group_indices([group_of(item) for item in items]),
    texts=[first_assistant_text(traj) for traj in trajs],
    num_turns=turn_counts(loss),
    truncated=stack("truncated"),
    turn_limited=stack("turn_limited"),
    anchor_ids=observation_anchors(stack("prompt"), stack("completion"), loss, pad_id),
  )
  return AgenticRows(
    batch=batch,
    behaviour_logps=behaviour,
    policy_versions=np.array([-1 if v is None else v for v in versions], np.int32),
    completions=list(batch.texts),
    trajectory_rewards=[float(traj.get("trajectory_reward") or 0.0) for traj in trajs],
    original_inputs=[dict(traj.get("original_input") or {}) for traj in trajs],
  )


def with_scores(batch: TrajectoryBatch, scores: Any) -> TrajectoryBatch:
  """`batch` with each row's score on its last agent token (`token_rewards`) and as its
  episode return; a row without agent tokens (tunix's overlong filter) scores nowhere."""
  scores = np.asarray(scores, np.float32).reshape(-1)
  mask = np.asarray(batch.loss_mask) > 0
  last = mask.shape[1] - 1 - np.argmax(mask[:, ::-1], axis=1)
  rewards = np.zeros(mask.shape, np.float32)
  rows = np.flatnonzero(mask.any(axis=1))
  rewards[rows, last[rows]] = scores[rows]
  return dataclasses.replace(batch, token_rewards=rewards, episode_returns=scores)


TIME_KEYS = ("env_time", "reward_time")  # tunix's episode latencies, `Trajectory.env_time`


def trajectory_times(items: Sequence[Any]) -> dict[str, tuple[float, Any]]:
  """tunix's agentic GRPO's `trajectory/<env_time|reward_time>/<key>/{mean,max,min}` of
  a batch of `TrajectoryItem`s: each latency entry (`reset_latency`, `step_latency` (one
  value per step), ...) over the episodes that have it, under tunix's names and
  aggregations; an entry with no value is 0, as tunix logs it."""
  metrics: dict[str, tuple[float, Any]] = {}
  for time_key in TIME_KEYS:
    entries = [item.traj.get(time_key) or {} for item in items]
    for key in sorted({key for entry in entries for key in entry}):
      values = np.concatenate([np.ravel(entry.get(key, 0.0) or 0.0) for entry in entries])
      values = values.astype(np.float64) if values.size else np.zeros(1)
      prefix = f"trajectory/{time_key}/{key}"
      for stat, reduce in (("mean", np.mean), ("max", np.max), ("min", np.min)):
        metrics[f"{prefix}/{stat}"] = (float(reduce(values)), reduce)
  return metrics
