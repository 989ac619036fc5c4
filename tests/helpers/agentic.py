"""The toy tunix agentic stack of the `AgenticPpoLearner` tests: a character tokenizer, a chat
parser, a counting environment, its cluster and learner, and readers of the logged history.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.agentic.agents import agent_types
from tunix.rl.agentic.environments import base_environment
from tunix.rl.agentic.parser.chat_template_parser import parser as chat_parser_lib

from tests.helpers.clusters import toy_cluster
from tests.helpers.launch import MAIN  # noqa: F401 (the agentic tests import it from here)
from tunix_ppo_ext import AgenticPpoConfig, AgenticPpoLearner
from tunix_ppo_ext._src.data.char_tokenizer import CharTokenizer

P, T = 48, 32  # prompt slots, episode width (the rollout's max_tokens_to_generate)

Mode = rl_cluster_lib.Mode


# A vocabulary of 9 (pad 0, bos 1, eos 2): the random toy policy ends its turns early.
ALPHABET = "ab:UA\n"


def tokenizer() -> CharTokenizer:
  return CharTokenizer(ALPHABET)


class PlainChat(chat_parser_lib.BaseChatTemplateParser):
  """Role markers `U:` and `A:` and nothing else: a conversation's text is its tokens."""

  def _init_tokens(self):
    return chat_parser_lib.TokenConfig(user_token="U:", assistant_token="A:")

  def _init_generation_prompt(self):
    return self.tokens.assistant_token


class CountTheAs(base_environment.BaseTaskEnv):
  """A user's three-turn tunix environment: each reply earns its count of `a`; the first
  observation is the prompt and the pair's own letter, each later one `b`."""

  def __init__(self, single_example, max_steps=3, **kwargs):
    super().__init__(task=single_example, max_steps=max_steps, **kwargs)

  def _initial_observation(self):
    prompt = str(np.asarray(self.task["prompts"]).reshape(-1)[0])
    return {"prompts": prompt + "ab"[self.extra_kwargs["pair_index"] % 2]}

  def _step_impl(self, action):
    reward = float(str(action).count("a"))
    return base_environment.EnvStepResult(observation="b", reward=reward, done=False, info={})


def agentic_cluster(
  seed: int = 0, *, critic: bool = True, max_steps: int = 2, reference: bool = True, **kwargs
):
  """The toy cluster of these tests; `kwargs` are `toy_cluster`'s (e.g. `checkpoint_dir`)."""
  return toy_cluster(
    tokenizer(),
    seed,
    prompt_len=P,
    tokens_per_call=T,
    return_logprobs=True,
    max_steps=max_steps,
    batch=2,
    with_critic=critic,
    with_reference=reference,
    lr=1e-4,
    **kwargs,
  )


def agentic_learner(cluster, **config) -> AgenticPpoLearner:
  config = {"num_generations": 2, "max_response_length": T, **config}
  return AgenticPpoLearner(
    cluster,
    AgenticPpoConfig(**config),
    chat_parser=PlainChat(cluster.tokenizer),
    env_class=CountTheAs,
  )


def prompts(steps: int) -> list[dict[str, np.ndarray]]:
  return [{"prompts": np.array(["ab", "ba"])}] * steps


def params(model) -> list[np.ndarray]:
  return [np.array(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


def history(cluster, prefix: str, name: str) -> np.ndarray:
  return np.asarray(cluster._rl_metrics_logger.get_metric_history(prefix, name, "train"))


def trainer_history(trainer, prefix: str, name: str) -> np.ndarray:
  return np.asarray(trainer.metrics_logger.get_metric_history(prefix, name, "train"))


def episode(tok, pair: int, group: int, turns: list[str], reward: float, prompt: str):
  """tunix's trajectory engine's "Token" episode of agent `turns` with a `U:bA:` between
  them, as a `TrajectoryItem`."""
  tokens, masks = [], []
  for n, turn in enumerate(turns):
    agent = tok.encode(turn)
    tokens += agent
    masks += [1] * len(agent)
    if n < len(turns) - 1:
      observed = tok.encode("U:bA:")
      tokens += observed
      masks += [0] * len(observed)
  traj = {
    "conversation_text": [{"role": "assistant", "content": turns[0]}],
    "prompt_tokens": [tok.bos_id(), *tok.encode(f"U:{prompt}A:")],
    "conversation_tokens": np.array(tokens),
    "conversation_masks": np.array(masks),
    "old_logprobs": -0.5 - 0.01 * np.arange(len(tokens)) * np.array(masks),
    "trajectory_reward": reward,
    "status": "SUCCEEDED",
    "policy_version": 0,
    "original_input": {"prompts": prompt},
  }
  return agent_types.TrajectoryItem(pair_index=pair, group_id=group, start_step=0, traj=traj)


EPISODES = [  # (group, agent turns, reward); T = 32 cuts the last one
  (0, ["ab", "aab"], 1.0),
  (0, ["b", "a", "ba"], 0.0),
  (1, ["aaa"], 2.0),
  (1, ["ab", "ba", "ab", "abababab", "aaaaaaaa"], 3.0),
]
