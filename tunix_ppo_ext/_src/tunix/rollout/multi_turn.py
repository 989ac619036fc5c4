"""Multi-turn episodes through tunix's own rollout engine, as token-exact PPO trajectories.

`MultiTurnRollout` is a `TrajectorySource`: for each batch of training input it plays one
episode per row, turn by turn, sampling every agent turn with the cluster's vanilla
rollout engine's model and weights (through `ContinuingSampler`, see "Context" below; with
`context="text"`, the engine's own `generate`), and returns the episodes as one
`MultiTurnBatch` row each:

  prompt_ids      BOS + first observation, left-padded to the rollout `max_prompt_length`
  completion_ids  agent turn 1 | EOS | observation 2 | agent turn 2 | EOS | ... | padding

Agent tokens are the engine's sampled ids as returned (never re-tokenised from text);
the sampler strips the EOS that ended a turn, so it is put back (stopping is an action;
a turn cut by `max_turn_tokens` gets none). Observations are tokenised once.
`loss_mask` is 1 on agent tokens and those EOS, `attention_mask` on every real token,
and a turn's reward sits on its last agent token.

Context: tunix 0.1.7's engines only take string prompts and tokenise them. With
`context="tokens"` (the default; vanilla engine only) the turns are sampled from the
exact ids of the trajectory so far (EOS included) by a `ContinuingSampler` (a subclass
of tunix's vanilla `Sampler`, on the engine's own model and weights), so sampling and
training see the same context. With `kv_cache="continue"` (the default) each turn
prefills only the tokens added since the previous turn and continues from its KV cache
(`continuing_sampler`); `kv_cache="reencode"` prefills the whole history every turn
(the cost grows with the square of the number of turns). `context="text"` passes decoded
text to the engine's `generate` instead (any engine); every later turn is then sampled
without the earlier EOS tokens in its context, which the trainer does see.

tunix's sampler masks the pad-id tokens of the context it prefills (attention, and
positions), while the trajectory's attention mask keeps every real token: earlier EOS
tokens when `eos_id == pad_id`, and, re-encoding (and with text), any pad-id token the
agent sampled, are seen by the trainer only; a continued turn attends to sampled pad ids
as the trainer does. `sampler_logprob_gap` measures the difference.
"""

from __future__ import annotations

import dataclasses
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
from tunix.generate import utils as generate_utils
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.rollout import base_rollout

from tunix_ppo_ext._src.data.chat import ChatFormat, assistant, user
from tunix_ppo_ext._src.data.trajectory import (
  MultiTurnBatch,
  RolloutStats,
  contiguous_group_ids,
  episode_env_ids,
  episode_seeds,
)
from tunix_ppo_ext._src.envs.base import (
  EnvSpec,
  anchor_key,
  env_name,
  is_malformed,
  validate_reset_output,
  validate_step_output,
)
from tunix_ppo_ext._src.metrics import episodes as episode_report
from tunix_ppo_ext._src.plugins.protocols import Environment
from tunix_ppo_ext._src.tunix import compat
from tunix_ppo_ext._src.tunix.cluster.mesh import check_multi_turn_rollout_mesh
from tunix_ppo_ext._src.tunix.rollout.context import Mode, RolloutContext
from tunix_ppo_ext._src.tunix.rollout.continuing_sampler import (
  ContinuingSampler,
  Conversation,
  TurnSampling,
)

# The ContinuingSampler of each vanilla engine's sampler (alive as long as the engine is).
_CONTINUING: weakref.WeakKeyDictionary[Any, ContinuingSampler] = weakref.WeakKeyDictionary()


@dataclasses.dataclass
class _Episode:
  """One episode's growing completion: per-token lists and the turn rewards' positions."""

  env: Environment
  prompt: list[int]
  tokens: list[int] = dataclasses.field(default_factory=list)
  loss: list[int] = dataclasses.field(default_factory=list)
  known: list[int] = dataclasses.field(default_factory=list)
  logps: list[float] = dataclasses.field(default_factory=list)
  rewards: list[tuple[int, float]] = dataclasses.field(default_factory=list)
  messages: list[dict[str, str]] = dataclasses.field(default_factory=list)  # with `chat`
  turns: int = 0
  seed: int = 0
  infos: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # one per step
  malformed: list[int] = dataclasses.field(default_factory=list)  # malformed turns' positions
  tag: str = ""  # the environment's metric tag (mixed runs)
  transcript: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (role, text)
  env_done: bool = False
  out_of_room: bool = False
  anchors: list[Any] = dataclasses.field(default_factory=list)  # each agent turn's state

  def note_anchor(self, turn: int) -> None:
    """Records the anchor of the state the agent acts in at `turn` (`anchor_key`)."""
    self.anchors.append(anchor_key(self.env, turn, (*self.prompt, *self.tokens)))

  @property
  def done(self) -> bool:
    return self.env_done or self.out_of_room

  def extend(self, ids: Sequence[int], loss: int, logps: Sequence[float] | None = None) -> None:
    """Appends `ids` with one loss flag; `logps` (sampler values) mark them as known."""
    self.tokens.extend(int(i) for i in ids)
    self.loss.extend([loss] * len(ids))
    self.known.extend([int(logps is not None)] * len(ids))
    self.logps.extend([float(x) for x in logps] if logps is not None else [0.0] * len(ids))


@dataclasses.dataclass(frozen=True)
class _Ids:
  """The cluster's special ids and tokenizer (the one the rollout engine uses)."""

  tokenizer: Any
  pad: int
  eos: int
  bos: int | None

  @classmethod
  def of(cls, cluster: rl_cluster_lib.RLCluster) -> _Ids:
    tokenizer = cluster.tokenizer
    return cls(tokenizer, cluster.rollout.pad_id(), cluster.rollout.eos_id(), tokenizer.bos_id())

  def prompt(self, text: str) -> list[int]:
    """Tokens of a first observation as tunix's sampler makes them (BOS unless falsy)."""
    ids = ([self.bos] if self.bos else []) + list(self.tokenizer.encode(text))
    return list(self.tokenizer.dedup_bos_ids(ids))


class MultiTurnRollout:
  """A `TrajectorySource` playing text environments with the cluster's rollout engine.

  Training input (see `episode_batches`): `"seed"` (or integer `"prompts"`) holds one
  episode seed per row, and with several environments `"env"` the index of the one each
  row plays; consecutive `group_size` rows share a seed (and environment) and form a group
  (`group_ids`). Every turn samples at most `max_turn_tokens` tokens for all rows at
  once (finished rows are fed their prompt and ignored, which keeps shapes fixed: one
  compilation). The rollout config's `kv_cache_size` must be at least
  `max_prompt_length + max_completion_len + max_turn_tokens` (with `build_cluster`:
  `max_tokens_to_generate >= max_completion_len + max_turn_tokens`).

  Args:
    env: a name in `envs.ENVIRONMENTS` or a factory called with `env_kwargs`.
    envs: several environments instead (`EnvSpec`s; a row plays `envs[training_input["env"]]`);
      each episode's metrics then also go under `env/<tag>/` (`metrics.episodes.env_metrics`).
    max_completion_len: `T`, the completion width; longer episodes are cut there.
    max_turns: agent turns per episode at most.
    max_turn_tokens: sampling steps per agent turn (an EOS among them ends the turn).
    group_size: rows per group; `None` uses the algorithm config's `num_generations`.
    context: "tokens" (exact ids, vanilla engine) or "text" (see the module docstring).
    kv_cache: with tokens, "continue" (each turn continues from the previous turn's KV
      cache) or "reencode" (each turn prefills the whole history: the old path).
    chat: format episodes with this `ChatFormat` (the tokenizer's chat template; see
      `tunix_ppo_ext._src.data.chat`), tokens context only.

  A turn whose `info` flags a malformed reply (`info["invalid_action"]`) is counted on its
  reward token in the batch's `malformed_turns` (the format penalty's place).

  The returned batch carries the episodes' outcomes (returns, turns, truncation) and its
  `metrics`, which the learner logs: the success rate and `env/<key>` info means
  (`metrics.episodes`), `rollout/reencoded_turns` (the turns that prefilled whole
  histories: the first, and with "continue" those the contexts did not extend) and, with a
  chat template, `rollout/chat_template_mismatch` (episodes whose ids differ from
  `apply_chat_template` of their whole conversation).
  """

  def __init__(
    self,
    env: str | Callable[..., Environment] = "memory",
    env_kwargs: dict[str, Any] | None = None,
    *,
    max_completion_len: int,
    max_turns: int = 8,
    max_turn_tokens: int = 2,
    group_size: int | None = None,
    context: Literal["tokens", "text"] = "tokens",
    kv_cache: Literal["continue", "reencode"] = "continue",
    on_samples: Callable[[int, list[dict[str, Any]]], None] | None = None,
    num_samples: int = 4,
    chat: ChatFormat | None = None,
    envs: Sequence[EnvSpec] | None = None,
  ):
    for name, value in (("max_completion_len", max_completion_len), ("max_turns", max_turns)):
      if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    if max_turn_tokens < 1:
      raise ValueError(f"max_turn_tokens must be >= 1, got {max_turn_tokens}")
    if context not in ("tokens", "text"):
      raise ValueError(f"context must be 'tokens' or 'text', got {context!r}")
    if kv_cache not in ("continue", "reencode"):
      raise ValueError(f"kv_cache must be 'continue' or 'reencode', got {kv_cache!r}")
    if chat is not None and context != "tokens":
      raise ValueError("a chat-templated rollout needs context='tokens' (exact template ids)")
    self.env = env
    self.env_kwargs = dict(env_kwargs or {})
    self.envs = list(envs) if envs else [EnvSpec(env, self.env_kwargs, tag=str(env))]
    self.max_completion_len = max_completion_len
    self.max_turns = max_turns
    self.max_turn_tokens = max_turn_tokens
    self.group_size = group_size
    self.context = context
    self.kv_cache = kv_cache
    self.on_samples, self.num_samples = on_samples, num_samples
    self.chat = chat
    self._calls = 0

  # ----- the rollout -----

  def __call__(
    self, context: RolloutContext, training_input: dict[str, Any], mode: Mode
  ) -> MultiTurnBatch:
    """Plays one episode per row of `training_input`; returns their trajectories."""
    cluster = context.rl_cluster
    check_multi_turn_rollout_mesh(cluster.cluster_config.role_to_mesh)
    seeds = episode_seeds(training_input)
    env_ids = episode_env_ids(training_input, len(self.envs))
    group_size = self.group_size or context.algo_config.num_generations
    group_ids = self._group_ids(seeds, group_size)
    if np.any(env_ids.reshape(-1, group_size) != env_ids.reshape(-1, group_size)[:, :1]):
      raise ValueError(f"rows of a group (consecutive {group_size}) must share one environment")
    ids = _Ids.of(cluster)
    config = self._checked_config(cluster, mode)
    pairs = zip(seeds, env_ids, strict=True)
    episodes = [self._start(seed, self.envs[e], ids, config) for seed, e in pairs]
    conversation = self._conversation(cluster)
    self._calls += 1
    # NaN/inf environment rewards: an error naming the episode, or kept for the learner to drop
    keep_nonfinite = getattr(context.algo_config, "nonfinite_rewards", "error") == "drop"
    for turn in range(1, self.max_turns + 1):
      if all(e.done for e in episodes):
        break
      output = self._generate(cluster, conversation, episodes, ids, config, turn)
      for row, episode in enumerate(episodes):
        if not episode.done:
          self._play_turn(episode, turn, output, row, ids, keep_nonfinite)
    stats = self._stats(episodes)
    metrics = self._report_episodes(cluster, episodes, group_ids, mode)
    if conversation is not None:
      metrics["rollout/reencoded_turns"] = (float(conversation.reencodes), np.sum)
    if self.chat is not None:
      count = sum(self.chat.mismatch(e.messages, e.prompt + e.tokens) for e in episodes)
      metrics["rollout/chat_template_mismatch"] = (float(count), np.sum)
    has_logps = bool(config.return_logprobs)
    batch = self._assemble(episodes, group_ids, ids, config.max_prompt_length, has_logps)
    return dataclasses.replace(
      batch,
      episode_returns=stats.episode_return,
      num_turns=stats.num_turns,
      truncated=stats.truncated,
      turn_limited=stats.turn_limited,
      metrics=metrics,
    )

  def _group_ids(self, seeds: np.ndarray, group_size: int) -> np.ndarray:
    """`[B]` group index `row // group_size`; each group must share one seed."""
    if len(seeds) % group_size:
      raise ValueError(f"batch of {len(seeds)} episodes is not a multiple of group {group_size}")
    groups = seeds.reshape(-1, group_size)
    if np.any(groups != groups[:, :1]):
      raise ValueError(f"rows of a group (consecutive {group_size}) must share one episode seed")
    return contiguous_group_ids(len(seeds), group_size)

  def _checked_config(
    self, cluster: rl_cluster_lib.RLCluster, mode: Mode
  ) -> base_rollout.RolloutConfig:
    """The mode's rollout config, checked for room (KV cache), stop tokens and offloading."""
    config = cluster.get_rollout_config(mode)
    needed = config.max_prompt_length + self.max_completion_len + self.max_turn_tokens
    if config.kv_cache_size < needed:
      raise ValueError(
        f"rollout kv_cache_size {config.kv_cache_size} < max_prompt_length + "
        f"max_completion_len + max_turn_tokens = {needed}; raise max_tokens_to_generate"
      )
    stops = set(config.eos_tokens or [cluster.rollout.eos_id()])
    if stops != {cluster.rollout.eos_id()}:
      raise ValueError(f"only the tokenizer's EOS may end a turn, got eos_tokens {sorted(stops)}")
    if cluster.cluster_config.offload_to_cpu:
      raise ValueError("MultiTurnRollout does not support offload_to_cpu")
    if cluster.rollout.eos_id() == cluster.rollout.pad_id():
      warnings.warn(
        "eos_id == pad_id: tunix's sampler treats an end-of-turn EOS in the context as "
        "padding, the trainer does not; turns after the first are sampled off-context",
        stacklevel=3,
      )
    return config

  def _start(
    self, seed: int, spec: EnvSpec, ids: _Ids, config: base_rollout.RolloutConfig
  ) -> _Episode:
    """Makes and resets one environment; its first observation becomes the prompt."""
    env = spec.make()
    try:
      output = env.reset(seed=int(seed))
    except Exception as err:
      raise RuntimeError(
        f"environment {env_name(env)!r}, turn 0: reset(seed={int(seed)}) raised "
        f"{type(err).__name__}: {err}"
      ) from err
    observation, _ = validate_reset_output(env_name(env), output)
    encode = ids.prompt if self.chat is None else self.chat.prompt  # chat: + assistant header
    prompt = _encode(env, 0, observation, encode)
    if len(prompt) > config.max_prompt_length:
      raise ValueError(
        f"environment {env_name(env)!r}: first observation is {len(prompt)} tokens, longer "
        f"than the rollout max_prompt_length {config.max_prompt_length}"
      )
    episode = _Episode(
      env=env,
      prompt=prompt,
      seed=int(seed),
      transcript=[("observation", observation)],
      messages=[] if self.chat is None else [user(observation)],
      tag=spec.tag,
    )
    episode.note_anchor(1)
    return episode

  def _play_turn(
    self,
    episode: _Episode,
    turn: int,
    output: base_rollout.RolloutOutput,
    row: int,
    ids: _Ids,
    keep_nonfinite: bool = False,
  ) -> None:
    """Appends the agent's turn (+ EOS) and, if another turn follows, the env's reply.

    An exception from `env.step` becomes a RuntimeError naming the environment, the turn
    and the episode row; malformed output a ValueError naming them.
    """
    agent = [int(t) for t in output.tokens[row]]
    logps = output.logprobs[row] if output.logprobs is not None else None
    episode.extend(agent, loss=1, logps=logps)
    if len(agent) < self.max_turn_tokens:  # the sampler stopped on EOS and stripped it
      episode.extend([ids.eos], loss=1)
    name = env_name(episode.env)
    action = ids.tokenizer.decode(agent)
    if self.chat is not None:
      episode.messages.append(assistant(self.chat.content(agent)))
    try:
      result = episode.env.step(action)
    except Exception as err:
      raise RuntimeError(
        f"environment {name!r}, turn {turn}, episode row {row}: step({action!r}) raised "
        f"{type(err).__name__}: {err}"
      ) from err
    try:
      observation, reward, terminated, truncated, info = validate_step_output(
        name, turn, result, allow_nonfinite_reward=keep_nonfinite
      )
    except ValueError as err:
      raise ValueError(f"{err} (episode row {row})") from None
    episode.rewards.append((len(episode.tokens) - 1, reward))
    if is_malformed(info):
      episode.malformed.append(len(episode.tokens) - 1)
    episode.turns = turn
    episode.infos.append(info)
    episode.transcript.append(("agent", action))
    if terminated or truncated:
      episode.env_done = True
      return
    if turn == self.max_turns:  # turn-limited: no agent turn will answer this observation
      return
    episode.extend(self._observation_ids(episode, turn, observation, ids, agent), loss=0)
    episode.transcript.append(("observation", observation))
    episode.out_of_room = len(episode.tokens) >= self.max_completion_len
    if not episode.out_of_room:
      episode.note_anchor(turn + 1)

  def _observation_ids(
    self, episode: _Episode, turn: int, observation: str, ids: _Ids, agent: list[int]
  ) -> list[int]:
    """The observation's ids: plain, or the chat template's text up to the next assistant
    header (with the EOT the template writes after a turn cut by `max_turn_tokens`)."""
    if self.chat is None:
      return _encode(episode.env, turn, observation, ids.tokenizer.encode)
    ended = len(agent) < self.max_turn_tokens
    chat_ids = self.chat.observation(episode.messages, observation, ended)
    episode.messages.append(user(observation))
    return chat_ids

  # ----- the engine call -----

  def _conversation(self, cluster: rl_cluster_lib.RLCluster) -> Conversation | None:
    """The batch's `Conversation` on a `ContinuingSampler` that follows the engine's model
    and weights (one per engine, shared by every rollout on it: its compilations too);
    None with `context="text"`."""
    if self.context == "text":
      return None
    engine = compat.vanilla_sampler(cluster.rollout)
    if engine is None:
      raise NotImplementedError(
        f"exact token contexts need tunix's vanilla engine, got {type(cluster.rollout).__name__}; "
        "use MultiTurnRollout(context='text')"
      )
    sampler = _CONTINUING.get(engine)
    if sampler is None:
      sampler = _CONTINUING[engine] = ContinuingSampler.like(engine)
    sampler.follow(engine)
    return sampler.conversation(continued=self.kv_cache == "continue")

  def _generate(
    self,
    cluster: rl_cluster_lib.RLCluster,
    conversation: Conversation | None,
    episodes: list[_Episode],
    ids: _Ids,
    config: base_rollout.RolloutConfig,
    turn: int,
  ) -> base_rollout.RolloutOutput | Any:
    """One agent turn for every row (finished rows get their prompt, output ignored).

    With token contexts, a continued turn starts where the previous one left off; a
    re-encoded one left-pads the contexts to `max_prompt_length` (or the longest context's
    power of two) when continuing, else to `max_prompt_length + max_completion_len` (the
    old path's one shape).
    """
    contexts = [e.prompt if e.done else e.prompt + e.tokens for e in episodes]
    seed = self._turn_seed(config, turn)
    with cluster.cluster_config.role_to_mesh[rl_cluster_lib.Role.ROLLOUT]:
      if conversation is None:
        turn_config = dataclasses.replace(
          config,
          max_prompt_length=config.max_prompt_length + self.max_completion_len,
          max_tokens_to_generate=self.max_turn_tokens,
          seed=seed,
        )
        texts = [_context_text(ids, c) for c in contexts]
        return cluster.rollout.generate(texts, turn_config)
      sampling = TurnSampling(
        max_tokens=self.max_turn_tokens,
        temperature=config.temperature,
        top_p=config.top_p,
        top_k=config.top_k,
        seed=seed,
        return_logprobs=bool(config.return_logprobs),
      )
      width = config.max_prompt_length
      if not conversation.continued:
        width += self.max_completion_len
      return conversation.turn(contexts, [not e.done for e in episodes], sampling, width)

  def _turn_seed(self, config: base_rollout.RolloutConfig, turn: int) -> int:
    """A fresh int sampling seed per (call, turn), derived from the config's int seed.

    The vanilla sampler turns an int seed into `PRNGKey(seed)` on every call, so the
    config's fixed seed would replay the same noise on every turn and step.
    """
    base = config.seed if isinstance(config.seed, int) else 0
    state = np.random.SeedSequence([base, self._calls, turn]).generate_state(1)[0]
    return int(state & 0x7FFFFFFF)

  def state_dict(self) -> dict[str, int]:
    """What a checkpoint keeps (the call count behind the sampling seeds), so a resumed run
    samples what the uninterrupted run sampled."""
    return {"calls": self._calls}

  def load_state_dict(self, state: dict[str, int]) -> None:
    """Restores `state_dict()`'s output."""
    self._calls = int(state["calls"])

  # ----- what the episodes show -----

  def _report_episodes(
    self, cluster, episodes: list[_Episode], group_ids, mode: Mode
  ) -> dict[str, tuple[float, Any]]:
    """The success rate and `env/<key>` info means (`metrics.episodes`); in an evaluation,
    hands `on_samples` up to `num_samples` conversations (one per group first)."""
    report = episode_report.episode_metrics([e.infos for e in episodes])
    if len(self.envs) > 1:
      returns = [sum(r for _, r in e.rewards) for e in episodes]
      tags = [e.tag for e in episodes]
      report |= episode_report.env_metrics(tags, returns, [e.infos for e in episodes])
    metrics = {k: (v, np.mean) for k, v in report.items()}
    if mode != Mode.EVAL or self.on_samples is None or self.num_samples < 1:
      return metrics
    firsts = np.flatnonzero(np.r_[True, np.diff(group_ids) != 0])
    rows = [*firsts, *(r for r in range(len(episodes)) if r not in set(firsts))]
    successes = episode_report.episode_successes([e.infos for e in episodes])
    shown = rows[: self.num_samples]
    samples = [_sample(row, episodes[row], successes[row]) for row in shown]
    self.on_samples(int(cluster.global_steps), samples)
    return metrics

  # ----- assembling the batch -----

  def _stats(self, episodes: list[_Episode]) -> RolloutStats:
    t = self.max_completion_len
    truncated = np.array([len(e.tokens) > t or e.out_of_room for e in episodes])
    return RolloutStats(
      episode_return=np.array([sum(r for _, r in e.rewards) for e in episodes], np.float64),
      num_turns=np.array([e.turns for e in episodes], np.int32),
      truncated=truncated,
      turn_limited=np.array([not e.done for e in episodes]),
      max_return=float(np.mean([getattr(e.env, "max_return", 0.0) for e in episodes])),
    )

  def _assemble(
    self,
    episodes: list[_Episode],
    group_ids: np.ndarray,
    ids: _Ids,
    prompt_len: int,
    has_logps: bool,
  ) -> MultiTurnBatch:
    """Pads/cuts every episode to `[B, T]` and stacks them."""
    rows = [_row(e, self.max_completion_len, ids.pad) for e in episodes]
    stack = {key: np.stack([r[key] for r in rows]) for key in rows[0]}
    prompts = [
      generate_utils.pad_to_length(np.array(e.prompt, np.int32), prompt_len, ids.pad, left=True)
      for e in episodes
    ]
    texts = [
      ids.tokenizer.decode(r["completion_ids"][r["attention_mask"] > 0].tolist()) for r in rows
    ]
    return MultiTurnBatch(
      prompt_ids=np.stack(prompts),
      completion_ids=stack["completion_ids"],
      attention_mask=stack["attention_mask"],
      loss_mask=stack["loss_mask"],
      token_rewards=stack["token_rewards"],
      sampler_logps=stack["sampler_logps"] if has_logps else None,
      sampler_logp_mask=stack["sampler_logp_mask"] if has_logps else None,
      malformed_turns=stack["malformed_turns"],
      group_ids=group_ids,
      texts=texts,
      anchor_ids=anchor_ids([e.anchors for e in episodes], self.max_turns),
    )


def anchor_ids(anchors: Sequence[Sequence[Any]], turns: int) -> np.ndarray:
  """`[B, turns]` int32: each distinct anchor key of the batch numbered in order of first
  appearance; -1 where a row played fewer turns."""
  numbers: dict[Any, int] = {}
  out = np.full((len(anchors), turns), -1, np.int32)
  for row, keys in enumerate(anchors):
    for turn, key in enumerate(keys[:turns]):
      out[row, turn] = numbers.setdefault(key, len(numbers))
  return out


def _row(episode: _Episode, width: int, pad_id: int) -> dict[str, np.ndarray]:
  """One episode as `[width]` arrays; cut at `width`, rewards past the cut moved back.

  A reward whose token was cut lands on the last kept agent token, so the row's rewards
  always sum to the episode return (and a malformed turn's count goes with its reward).
  """
  n = min(len(episode.tokens), width)
  loss = np.zeros(width, np.int32)
  loss[:n] = episode.loss[:n]
  last_agent = int(np.flatnonzero(loss)[-1])  # the completion starts with an agent turn
  rewards = np.zeros(width, np.float32)
  for position, reward in episode.rewards:
    rewards[position if position < n else last_agent] += reward
  malformed = np.zeros(width, np.int32)
  for position in episode.malformed:
    malformed[position if position < n else last_agent] += 1
  completion = np.full(width, pad_id, np.int32)
  completion[:n] = episode.tokens[:n]
  attention = np.zeros(width, np.int32)
  attention[:n] = 1
  known = np.zeros(width, np.int32)
  known[:n] = episode.known[:n]
  logps = np.zeros(width, np.float32)
  logps[:n] = episode.logps[:n]
  return {
    "completion_ids": completion,
    "attention_mask": attention,
    "loss_mask": loss,
    "token_rewards": rewards,
    "sampler_logps": logps * known,
    "sampler_logp_mask": known,
    "malformed_turns": malformed,
  }


def _sample(row: int, episode: _Episode, success: bool | None) -> dict[str, Any]:
  """One episode as a sample: row, seed, return, success (None: the batch reported none;
  `episode_report.episode_successes`), turns."""
  return {
    "row": int(row),
    "seed": episode.seed,
    "return": float(sum(r for _, r in episode.rewards)),
    "success": success,
    "turns": episode_report.conversation(episode.transcript),
  }


def _encode(
  env: Environment, turn: int, text: str, encode: Callable[[str], Sequence[int]]
) -> list[int]:
  """`encode(text)`, with tokenizer errors naming the environment and the turn."""
  try:
    return [int(i) for i in encode(text)]
  except ValueError as err:
    raise ValueError(
      f"environment {env_name(env)!r}, turn {turn}: observation {text!r} cannot be tokenised: {err}"
    ) from err


def _context_text(ids: _Ids, context: Sequence[int]) -> str:
  """Text of a context for string-only engines (special ids, EOS included, are dropped)."""
  return ids.tokenizer.decode([i for i in context if i not in (ids.bos, ids.pad, ids.eos)])
