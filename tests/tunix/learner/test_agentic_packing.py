"""`AgenticPpoLearner` under tunix's sequence packing (`max_seq_token_per_tpu`): the same
multi-turn episodes of tunix's orchestrator trained packed and padded give the same losses,
metrics and updates of the actor and the critic; tunix's packed rows come back as the padded
rows they were packed from."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from tunix.rl import utils as rl_utils

from tests.helpers.agentic import (
  EPISODES,
  MAIN,
  CountTheAs,
  Mode,
  P,
  PlainChat,
  T,
  agentic_cluster,
  agentic_learner,
  episode,
  history,
  params,
  prompts,
  tokenizer,
  trainer_history,
)
from tunix_ppo_ext import AgenticPpoConfig, AgenticPpoLearner, ops
from tunix_ppo_ext._src.tunix.learner import loss_fns

pytestmark = [
  pytest.mark.tunix,
  pytest.mark.tunix_facing,  # also run on tunix main (.ci/run, lane 2)
  pytest.mark.skipif(not MAIN, reason="AgenticPpoLearner needs tunix main"),
]
BUDGET = 4 * (P + T)  # a step's 4 episodes fit one packed row


class Kept(AgenticPpoLearner):
  """Keeps the rollout phase's examples and the packed chunks tunix's loop trains."""

  def process_results(self, trajectories, mode, expected_step):
    examples = super().process_results(trajectories, mode, expected_step)
    self.examples.extend(examples)
    return examples

  def packed_example(self, example):
    self.packed.append(super().packed_example(example))
    return self.packed[-1]


def trained(budget: int | None, **keys):
  """One step of a fresh toy cluster (the same weights every call) on two prompts."""
  cluster = agentic_cluster(max_steps=1)
  cluster.cluster_config.training_config.max_seq_token_per_tpu = budget
  config = AgenticPpoConfig(num_generations=2, max_response_length=T, **keys)
  learner = Kept(cluster, config, chat_parser=PlainChat(cluster.tokenizer), env_class=CountTheAs)
  learner.examples, learner.packed = [], []
  before = params(cluster.actor_trainer.model), params(cluster.critic_trainer.model)
  learner.train(prompts(2))
  assert cluster.actor_trainer.train_steps == 1
  after = params(cluster.actor_trainer.model), params(cluster.critic_trainer.model)
  return cluster, learner, before, after


def rows(examples, name: str) -> np.ndarray:
  """A field of the rollout phase's examples (one per group, in the order the groups
  finished), stacked in the order of the rows' tokens."""
  stack = lambda key: np.concatenate([np.asarray(getattr(e, key)) for e in examples])  # noqa: E731
  order = sorted(
    range(len(stack("completion_ids"))), key=lambda i: stack("completion_ids")[i].tobytes()
  )
  return stack(name)[order]


LOGGED = [("actor", "actor", name) for name in ("pg_loss", "pg_clipfrac", "ppo_kl", "entropy")]
LOGGED += [("actor", "actor", "kl_loss")]
LOGGED += [("critic", "critic", name) for name in ("vf_loss", "vpred_mean", "vf_clipfrac")]


@pytest.mark.parametrize(
  "keys",
  [
    {"loss_agg_mode": "token-mean"},
    {  # per episode: a packed row holds all four; rollout correction's weights kept
      "loss_agg_mode": "seq-mean-token-mean",
      "value_loss_agg_mode": "seq-mean-token-sum",
      "rollout_is": "token",
      "use_rollout_logps": False,
    },
  ],
  ids=["token_mean", "seq_mean"],
)
def test_packed_episodes_train_as_the_padded_ones(keys):
  keys = {"kl_penalty": "loss", "kl_loss_coef": 0.1, "entropy_coef": 0.01, **keys}
  padded = trained(None, **keys)
  packed = trained(BUDGET, **keys)
  for name in ("completion_ids", "loss_mask", "advantages", "old_values"):  # the same episodes
    ours, theirs = (rows(run[1].examples, name) for run in (packed, padded))
    np.testing.assert_array_equal(ours, theirs, name)
  loss, attention = (
    rows(padded[1].examples, "loss_mask"),
    rows(padded[1].examples, "attention_mask"),
  )
  assert np.any((attention > 0) & (loss == 0))  # observations between the turns
  [chunk] = packed[1].packed
  assert np.asarray(chunk.segment_ids).shape == (1, BUDGET)
  assert int(np.asarray(chunk.segment_ids).max()) == 4 and chunk.pack_slots is not None
  np.testing.assert_array_equal(np.asarray(chunk.loss_mask).sum(), loss.sum())
  layout = loss_fns.example_packing(chunk)  # the losses' passes run on tunix's packed row
  assert isinstance(layout, ops.Packing) and (layout.rows, layout.width) == (1, BUDGET)
  real = np.concatenate([np.asarray(chunk.prompt_mask), np.asarray(chunk.attention_mask)], 1)
  placed = ops.pack(jnp.asarray(real), layout)  # every real token in one of tunix's slots
  np.testing.assert_array_equal(np.asarray(placed), np.asarray(chunk.segment_ids) > 0)
  assert history(packed[0], "packing", "seqs_per_pack").tolist() == [4.0]
  for role, prefix, name in LOGGED:
    got = trainer_history(getattr(packed[0], f"{role}_trainer"), prefix, name)
    want = trainer_history(getattr(padded[0], f"{role}_trainer"), prefix, name)
    assert len(want) == 1, (prefix, name)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)
  for before, after, padded_after in zip(packed[2], packed[3], padded[3], strict=True):
    for start, end, reference in zip(before, after, padded_after, strict=True):
      assert not np.allclose(start, reference) or np.allclose(start, end)
      np.testing.assert_allclose(end - start, reference - start, rtol=1e-4, atol=1e-7)


def test_packing_needs_this_package_s_losses():
  cluster = agentic_cluster(max_steps=1)
  cluster.cluster_config.training_config.max_seq_token_per_tpu = BUDGET
  config = AgenticPpoConfig(num_generations=2, max_response_length=T, value_loss_fn="ppo")
  with pytest.raises(ValueError, match=r"AgenticPpoConfig\.value_loss_fn='ppo' is tunix's") as e:
    AgenticPpoLearner(cluster, config, chat_parser=PlainChat(cluster.tokenizer))
  assert "\n" not in str(e.value)


def test_tunix_s_packed_rows_come_back_as_the_padded_rows_they_were_packed_from():
  """The four multi-turn episodes of `test_agentic_ppo` (one cut at `T`) through tunix's own
  `pack_sequences` and back: the padded rows, every token placed in its packed slot; an
  episode packed twice (or never handed to tunix) is refused in one line."""
  tok = tokenizer()
  items = [episode(tok, n % 2, g, turns, r, "ab") for n, (g, turns, r) in enumerate(EPISODES)]
  cluster = agentic_cluster(max_steps=1)
  cluster.cluster_config.training_config.max_seq_token_per_tpu = BUDGET
  learner = agentic_learner(cluster, use_rollout_logps=False)
  [handed] = learner.process_results(items, Mode.TRAIN, 0)
  np.testing.assert_array_equal(handed.completion_mask, handed.attention_mask)  # packed whole
  [[packed]] = list(rl_utils.pack_sequences(iter([[handed]]), BUDGET, sequences_per_update=4))
  chunk = learner.packed_example(packed)
  assert np.asarray(chunk.completion_ids).shape[0] == 4  # 4 episodes: a power of two
  for name in ("completion_ids", "loss_mask", "advantages", "old_values", "kl_coef"):
    np.testing.assert_array_equal(rows([chunk], name), rows([handed], name), name)
  np.testing.assert_array_equal(rows([chunk], "completion_mask"), rows([handed], "loss_mask"))
  tokens = np.concatenate([np.asarray(chunk.prompt_ids), np.asarray(chunk.completion_ids)], 1)
  placed = np.asarray(ops.pack(jnp.asarray(tokens), loss_fns.example_packing(chunk)))
  segments = np.asarray(packed.segment_ids)
  np.testing.assert_array_equal(
    placed[segments > 0], np.asarray(packed.completion_ids)[segments > 0]
  )
  with pytest.raises(ValueError, match=r"^packing: a packed episode is none of the rows") as e:
    learner.packed_example(packed)  # its rows were taken
  assert "\n" not in str(e.value)
