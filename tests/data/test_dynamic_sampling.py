"""DAPO on trajectory batches: the overlong penalty on each episode's reward (NumPy reference
from DAPO eq. 13), the rows kept and moved by dynamic sampling, its rounds and metrics."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.scores import batch as shaping_batch
from tests.helpers.scores import multi_turn_batch, np_overlong
from tunix_ppo_ext._src.data.dynamic_sampling import (
  concat_batches,
  episode_scores,
  fill_with_informative_groups,
  overlong_shaped,
  round_input,
  take_rows,
)

pytestmark = pytest.mark.fast


@pytest.mark.parametrize("max_len, cache, factor", [(5, 2, 1.0), (4, 4, 0.5), (3, 1, 2.0)])
def test_overlong_penalty_lands_on_the_last_agent_token(max_len, cache, factor):
  b = shaping_batch()  # agent tokens per row: 3, 3, 3, 0, 1, 4
  shaped, penalty = overlong_shaped(b, max_len, cache, factor)
  lengths = b.loss_mask.sum(-1)
  expected = np.array([np_overlong(n, max_len, cache, factor) for n in lengths], np.float32)
  np.testing.assert_allclose(penalty, expected, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(
    shaped.token_rewards.sum(-1), b.token_rewards.sum(-1) + expected, rtol=1e-6, atol=1e-6
  )
  last = np.array([3, 4, 2, 0, 0, 4])
  changed = shaped.token_rewards != b.token_rewards
  for row in range(6):  # turn rewards stay; only the last agent token may change
    assert set(np.flatnonzero(changed[row])) <= {last[row]}, row
  assert not changed[3].any()  # no agent token, length 0: no penalty


def test_rows_are_taken_and_concatenated_with_every_field():
  a, b = multi_turn_batch([0, 1, 2, 3]), multi_turn_batch([4, 5], round_index=1)
  picked = take_rows(concat_batches([a, b]), np.array([5, 0, 3]))
  assert picked.texts == ["r1e1", "r0e0", "r0e3"]
  np.testing.assert_array_equal(picked.completion_ids[:, 0], [101, 0, 3])
  np.testing.assert_array_equal(picked.episode_returns, [5, 0, 3])
  assert picked.sampler_logp_mask.shape == (3, 3) and picked.num_turns is None
  masked = take_rows(a, np.array([True, False, False, True]))
  np.testing.assert_array_equal(masked.completion_ids[:, 0], [0, 3])


def test_each_round_draws_new_seeds_that_keep_groups():
  seeds = np.array([7, 7, 9, 9], np.int64)
  first = {"prompts": seeds.astype(str), "seed": seeds, "answer": np.array(list("abcd"))}
  assert round_input(first, 0) is first
  second = round_input(first, 1)
  new = second["seed"]
  assert new[0] == new[1] and new[2] == new[3] and new[0] != new[2]
  assert not set(new) & {7, 9} and 0 <= new.min() and new.max() < 2**31
  np.testing.assert_array_equal(second["prompts"], new.astype(str))
  np.testing.assert_array_equal(second["answer"], first["answer"])
  np.testing.assert_array_equal(round_input(first, 1)["seed"], new)  # reproducible
  assert not set(round_input(first, 2)["seed"]) & set(new)


def reference_fill(rounds_scores, max_rounds, group):
  """Dynamic sampling written out: rows (round, row) of the first informative groups (a
  group of one counts as informative), then dropped groups; rounds; kept share; masked."""
  size = len(rounds_scores[0])
  kept, dropped, used = [], [], 0
  for r, scores in enumerate(rounds_scores[:max_rounds]):
    used = r + 1
    for start in range(0, size, group):
      rows = [(r, i) for i in range(start, start + group)]
      values = scores[start : start + group]
      (kept if group == 1 or len(set(values)) > 1 else dropped).extend(rows)
    if len(kept) >= size:
      break
  missing = max(size - len(kept), 0)
  return (kept + dropped)[:size], used, len(kept) / (used * size), missing


@settings(max_examples=25)
@given(
  table=st.lists(
    st.lists(st.sampled_from([0.0, 1.0]), min_size=6, max_size=6), min_size=4, max_size=4
  ),
  max_rounds=st.integers(1, 4),
)
def test_dynamic_sampling_matches_its_reference(table, max_rounds):
  calls = []

  def generate(r):
    calls.append(r)
    return multi_turn_batch(table[r], round_index=r)

  out, stats = fill_with_informative_groups(generate, max_rounds)
  rows, rounds, kept_frac, missing = reference_fill(table, max_rounds, 2)
  assert calls == list(range(rounds))
  assert stats["rounds"] == rounds
  if rounds == 1 and missing == 0:  # the first batch was all informative: returned as it is
    assert stats == {"rounds": 1.0, "kept_frac": 1.0, "masked_frac": 0.0}
    return
  np.testing.assert_array_equal(out.completion_ids[:, 0], [100 * r + i for r, i in rows])
  np.testing.assert_allclose(out.token_rewards[:, 2], [table[r][i] for r, i in rows])
  trained = np.arange(6) < 6 - missing
  np.testing.assert_array_equal(out.loss_mask.any(1), trained)
  np.testing.assert_array_equal(out.sampler_logp_mask.any(1), trained)
  np.testing.assert_array_equal(out.group_ids, [0, 0, 1, 1, 2, 2])
  assert stats["kept_frac"] == pytest.approx(kept_frac)
  assert stats["masked_frac"] == pytest.approx(missing / 6)


def test_the_metric_decides_what_counts_as_equal():
  # token rewards differ within group 0 (an overlong penalty), the environment's returns do not
  b = multi_turn_batch([1.0, 0.5, 1.0, 0.0], returns=[1.0, 1.0, 1.0, 0.0])
  np.testing.assert_array_equal(episode_scores(b, "episode_return"), [1, 1, 1, 0])
  same, stats = fill_with_informative_groups(lambda r: b, 1, "seq_reward")
  assert same is b and stats["masked_frac"] == 0.0
  _, stats = fill_with_informative_groups(lambda r: b, 1, "episode_return")
  assert stats["masked_frac"] == 0.5 and stats["kept_frac"] == 0.5
  with pytest.raises(ValueError, match="no episode_returns"):
    episode_scores(dataclasses.replace(b, episode_returns=None), "episode_return")


def test_groups_of_one_are_kept_and_scattered_groups_refused():
  b = multi_turn_batch([1.0, 1.0, 1.0], group=1)
  assert fill_with_informative_groups(lambda r: b, 3)[0] is b
  scattered = dataclasses.replace(multi_turn_batch([1.0, 1.0, 0.0, 1.0]), group_ids=[0, 1, 0, 1])
  with pytest.raises(ValueError, match="groups of consecutive rows of one size"):
    fill_with_informative_groups(lambda r: scattered, 2)
