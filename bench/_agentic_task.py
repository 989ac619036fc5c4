"""The agentic benches' task, model and learners on tunix main's own agentic stack.

The task (`GuessTheLetter`, a tunix `BaseTaskEnv`): a secret letter of `LETTERS` per
prompt; each agent turn's first character is its guess, answered `<` (the secret comes
earlier), `>` (later) or `?` (not a letter, an empty reply too: before 2026-12-06 an empty
reply was answered `>`); a hit ends the episode with reward 1 (a success), else the
episode ends after `MAX_TURNS` guesses with reward 0. Binary search
always succeeds in 3 turns; the toy policy starts near uniform over its 14-token
vocabulary (a hit about 1 turn in 14).

The model: the package's toy Qwen3 (1 layer, width 32) of `tunix_ppo_ext.models`, its
critic's backbone initialised from the policy, on tunix's `RLCluster` (vanilla rollout,
the sampler's log-probs kept, each request sampled with its own key: `AgenticPpoLearner`
makes its engine do so, and `grpo_learner` does the same for tunix's GRPO learner, so both
train on the same kind of episodes). The
learners: this package's `AgenticPpoLearner`, and
tunix's own agentic `GRPOLearner`, both over tunix's orchestrator and `ModelAgent`.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
from tunix.rl.agentic import agentic_grpo_learner
from tunix.rl.agentic.environments import base_environment
from tunix.rl.agentic.parser.chat_template_parser import parser as chat_parser_lib

from tunix_ppo_ext import AgenticPpoConfig, AgenticPpoLearner
from tunix_ppo_ext.data import CharTokenizer
from tunix_ppo_ext.models import ClusterSpec, build_cluster, make_models

LETTERS = "abcd"
ALPHABET = LETTERS + "<>?:UA\n"  # with pad, bos and eos: 14 tokens
MAX_TURNS = 3
P, T = 64, 32  # prompt slots (a later turn's prompt holds the earlier turns); episode width


class RoleMarkers(chat_parser_lib.BaseChatTemplateParser):
  """tunix chat parser with role markers `U:` and `A:` only (a toy vocabulary has no
  chat template): a conversation's text is its tokens."""

  def _init_tokens(self) -> chat_parser_lib.TokenConfig:
    return chat_parser_lib.TokenConfig(user_token="U:", assistant_token="A:")

  def _init_generation_prompt(self) -> str:
    return self.tokens.assistant_token


class GuessTheLetter(base_environment.BaseTaskEnv):
  """The guessing game of the module docstring; the secret is the task's `secret`. A guess
  that is not a letter (an empty reply too) costs `invalid_penalty` (a format penalty; 0:
  none); tunix sums an episode's rewards."""

  def __init__(
    self, single_example: dict[str, Any], invalid_penalty: float = 0.0, **kwargs: Any
  ) -> None:
    super().__init__(task=single_example, max_steps=MAX_TURNS, **kwargs)
    self.invalid_penalty = invalid_penalty

  def _initial_observation(self) -> dict[str, str]:
    return {"prompts": str(np.asarray(self.task["prompts"]).reshape(-1)[0])}

  def _step_impl(self, action: Any) -> base_environment.EnvStepResult:
    secret = str(np.asarray(self.task["secret"]).reshape(-1)[0])
    guess = str(action)[:1]
    if guess == secret:
      return base_environment.EnvStepResult(observation="", reward=1.0, done=True, info={})
    if not guess or guess not in LETTERS:
      reward = -self.invalid_penalty
      return base_environment.EnvStepResult(observation="?", reward=reward, done=False, info={})
    hint = "<" if secret < guess else ">"
    return base_environment.EnvStepResult(observation=hint, reward=0.0, done=False, info={})


class SuccessLog:
  """A tunix `metric_fn` that keeps every episode's success (reward > 0.5: a hit, less
  any format penalties, which stay under 0.5), in the order
  the learner scored them, and logs the batch's share as `success`."""

  def __init__(self) -> None:
    self.successes: list[bool] = []

  def __call__(self, prompts, completions, advantages, rewards, **_: Any) -> dict[str, Any]:
    hits = [float(r) > 0.5 for r in np.asarray(rewards).reshape(-1)]
    self.successes += hits
    return {"success": (float(np.mean(hits)), np.mean)}

  def per_batch(self, episodes: int) -> list[float]:
    """The success rate of each full batch of `episodes` episodes."""
    n = len(self.successes) // episodes
    return [float(np.mean(self.successes[i * episodes : (i + 1) * episodes])) for i in range(n)]


class ReplyLog:
  """Every reply `GuessTheLetter` was sent, by episode (tunix's `group_id`, `pair_index`):
  use `env_class()` as the learner's environment."""

  def __init__(self) -> None:
    self.replies: dict[tuple[int, int], list[str]] = collections.defaultdict(list)

  def env_class(self) -> type:
    """`GuessTheLetter` recording each reply here."""
    replies = self.replies

    class Recorded(GuessTheLetter):
      def _step_impl(self, action: Any) -> base_environment.EnvStepResult:
        ids = self.extra_kwargs
        replies[(int(ids["group_id"]), int(ids.get("pair_index", 0)))].append(str(action))
        return super()._step_impl(action)

    return Recorded

  def per_batch(self, prompts: int, batches: int) -> dict[str, list[float]]:
    """Per batch of `prompts` groups: the share of empty first replies, the first replies'
    mean length (characters: tokens) and the mean turns an episode took."""
    stats: dict[str, list[float]] = {"empty_first": [], "first_len": [], "turns": []}
    for b in range(batches):
      episodes = [r for (g, _), r in sorted(self.replies.items()) if g // prompts == b and r]
      if not episodes:
        break
      stats["empty_first"].append(float(np.mean([not r[0] for r in episodes])))
      stats["first_len"].append(float(np.mean([len(r[0]) for r in episodes])))
      stats["turns"].append(float(np.mean([len(r) for r in episodes])))
    return stats


def dataset(steps: int, batch: int, seed: int) -> list[dict[str, np.ndarray]]:
  """`steps` batches of `batch` prompts `?`, each with a random secret of `LETTERS`."""
  rng = np.random.default_rng(seed)
  return [
    {"prompts": np.array(["?"] * batch), "secret": rng.choice(list(LETTERS), size=batch)}
    for _ in range(steps)
  ]


def cluster(
  seed: int, *, critic: bool, steps: int, batch: int, lr: float, prompt_len: int = P, width: int = T
) -> Any:
  """tunix's `RLCluster` of the toy models (seed `seed`), the critic left out without
  `critic`; the critic trains at the actor's `lr`. `prompt_len` prompt slots, episodes of
  `width` tokens."""
  tokenizer = CharTokenizer(ALPHABET)
  policy, value_model, reference = make_models(tokenizer, seed=seed)
  spec = ClusterSpec(
    max_steps=steps,
    batch=batch,
    max_prompt_length=prompt_len,
    max_tokens_to_generate=width,
    lr=lr,
    seed=seed,
    return_logprobs=True,
  )
  return build_cluster(
    policy, value_model if critic else None, tokenizer, spec, reference=reference
  )


def learner_kwargs(
  engine: Any,
  metric_fns: Sequence[Any],
  env_class: type = GuessTheLetter,
  invalid_penalty: float = 0.0,
) -> dict[str, Any]:
  """What both learners take besides their config: the task's environment (its format
  penalty `invalid_penalty`) and parser."""
  return {
    "chat_parser": RoleMarkers(engine.tokenizer),
    "metric_fns": list(metric_fns),
    "env_class": env_class,
    "env_kwargs": {"invalid_penalty": invalid_penalty},
  }


def ppo_learner(
  engine: Any,
  metric_fns: Sequence[Any],
  width: int = T,
  env_class: type = GuessTheLetter,
  invalid_penalty: float = 0.0,
  **keys: Any,
) -> AgenticPpoLearner:
  """`AgenticPpoLearner` on `engine` (episodes of `width` tokens, `env_class` the task's
  environment with its `invalid_penalty`) with the `AgenticPpoConfig` keys `keys`."""
  config = AgenticPpoConfig(max_response_length=width, **keys)
  kwargs = learner_kwargs(engine, metric_fns, env_class, invalid_penalty)
  return AgenticPpoLearner(engine, config, **kwargs)


def grpo_learner(engine: Any, metric_fns: Sequence[Any], **keys: Any) -> Any:
  """tunix's own agentic `GRPOLearner` on `engine` with the `GRPOConfig` keys `keys`."""
  # a key per call, numbered (AgenticPpoLearner keys its calls by episode and turn instead)
  generate, calls = engine.rollout.generate, itertools.count(1)
  engine.rollout.generate = lambda prompts, rollout, **kw: generate(
    prompts, dataclasses.replace(rollout, seed=next(calls)), **kw
  )
  config = agentic_grpo_learner.GRPOConfig(max_response_length=T, **keys)
  return agentic_grpo_learner.GRPOLearner(engine, config, **learner_kwargs(engine, metric_fns))
