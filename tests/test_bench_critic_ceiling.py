"""`bench/critic_ceiling.py`: the best explained variance a critic can reach on `guess`."""

from __future__ import annotations

import pytest

from tests.helpers.bench import load_bench
from tunix_ppo_ext.envs import GuessEnv

pytestmark = pytest.mark.tunix


def _describe(policy: str, high: int, max_turns: int, valid_reward: float = 0.1):
  bench = load_bench("critic_ceiling")
  env = GuessEnv(1, high, max_turns, turn_penalty=0.2, valid_reward=valid_reward)
  return bench.describe(env, bench.POLICIES[policy])


def test_the_scripted_policies_win_as_often_as_counting_says():
  # uniform with replacement: 1 - (1 - 1/10)^4; never repeating: 4 of 10; bisect: always
  assert _describe("uniform", 10, 4)["success"] == pytest.approx(1 - 0.9**4)
  assert _describe("fresh", 10, 4)["success"] == pytest.approx(0.4)
  assert _describe("bisect", 10, 4)["success"] == pytest.approx(1.0)


def test_the_ceiling_of_a_two_number_bisect_by_hand():
  # secret 1: guess 1 hits (G 1.1); secret 2: guess 1 misses (0.1), guess 2 hits (0.8 + 0.1).
  # Points (equal weights): turn 1 G 1.1 and 1.0 (one history), turn 2 G 0.9 (its own).
  row = _describe("bisect", 2, 2)
  total = ((1.1 - 1.0) ** 2 + 0.0 + (0.9 - 1.0) ** 2) / 3
  within = (2 / 3) * ((1.1 - 1.05) ** 2 + (1.0 - 1.05) ** 2) / 2
  assert row["ceiling"] == pytest.approx(1 - within / total)  # 0.75
  assert row["told the secret"] == pytest.approx(1.0)  # deterministic given the secret


def test_one_random_guess_leaves_everything_unexplained():
  row = _describe("uniform", 2, 1)
  assert row["success"] == pytest.approx(0.5)
  assert row["ceiling"] == pytest.approx(0.0, abs=1e-12)
  assert row["told the secret"] == pytest.approx(0.0, abs=1e-12)


def _noise(policy: str, high: int, max_turns: int, lambdas, group: int = 4):
  bench = load_bench("critic_ceiling")
  env = GuessEnv(1, high, max_turns, turn_penalty=0.2, valid_reward=0.1)
  return bench.noise(env, bench.POLICIES[policy], lambdas, group)


def test_the_perfect_critic_s_advantage_noise_of_a_two_number_bisect_by_hand():
  # V(start) = (1.1 + 1.0) / 2; after "1, Higher": 0.9. Secret 1: one turn, A = 0.05;
  # secret 2: A = 0.1 + 0.9 - 1.05 = -0.05, then 0.9 - 0.9 = 0. Turns weigh 0.5, 0.5, 0.5.
  row = _noise("bisect", 2, 2, [0.0, 1.0])
  expected = (0.5 * 0.05**2 + 0.5 * 0.05**2) / 1.5
  assert row["critic, lambda 0"] == pytest.approx(expected)
  assert row["critic, lambda 1"] == pytest.approx(expected)
  assert row["grpo, 4"] == pytest.approx(0.0) and row["rloo, 4"] == pytest.approx(0.0)


def test_the_group_baselines_noise_against_every_group_enumerated():
  # one uniform guess of 2: G is 1.1 or 0.1 with 1/2 each, whatever the secret; enumerate
  # every group of 4 and average each member's squared advantage
  import itertools

  grpo = rloo = 0.0
  for group in itertools.product([1.1, 0.1], repeat=4):
    for i, g in enumerate(group):
      others = [x for j, x in enumerate(group) if j != i]
      grpo += (g - sum(group) / 4) ** 2 / 16 / 4
      rloo += (g - sum(others) / 3) ** 2 / 16 / 4
  row = _noise("uniform", 2, 1, [0.5])
  assert row["grpo, 4"] == pytest.approx(grpo) and row["rloo, 4"] == pytest.approx(rloo)
  assert row["critic, lambda 0.5"] == pytest.approx(0.25)  # G - 0.6 = +-0.5


@pytest.mark.parametrize(
  ("argv", "named"),
  [
    (["--high", "0"], "--high 0 is invalid"),
    (["--max-turns", "0"], "--max-turns 0 is invalid"),
    (["--turn-penalty", "0.5"], "--turn-penalty 0.5 is invalid with max_turns=4"),
    (["--valid-reward", "-1"], "--valid-reward -1.0 is invalid"),
    (["--noise", "--lambdas", "2"], "--lambdas 2.0: a GAE lambda is a number in [0, 1]"),
    (["--noise", "--lambdas", "nan"], "--lambdas nan"),
    (["--high", "32", "--max-turns", "5", "--policies", "uniform"], "uniform 1073741824, above"),
    (["--high", "32", "--max-turns", "5", "--policies", "consistent"], "consistent 32528704"),
  ],
)
def test_a_bad_option_is_one_line_before_any_enumeration(argv, named, monkeypatch, capsys):
  """Each was a ValueError traceback, a table of lambda-2 noise, or an enumeration that did
  not end (consistent at 32 and 5, which the docstring said would)."""
  bench = load_bench("critic_ceiling")
  monkeypatch.setattr("sys.argv", ["critic_ceiling.py", *argv])
  with pytest.raises(SystemExit) as exit_:
    bench.main()
  assert exit_.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert named in err[-1] and err[-1].startswith("critic_ceiling.py: error:"), err


def test_the_episode_count_is_what_the_enumeration_plays():
  bench = load_bench("critic_ceiling")
  env = GuessEnv(1, 6, 3, turn_penalty=0.2)
  for name in ("consistent", "bisect"):
    played = sum(1 for _ in bench._episodes(env, bench.POLICIES[name]))
    assert bench.episode_count(name, 6, 3) == played
  assert bench.episode_count("uniform", 6, 3) >= sum(
    1 for _ in bench._episodes(env, bench.POLICIES["uniform"])
  )


def test_bisect_takes_the_middle_of_a_large_range_without_listing_it():
  """`bisect` listed every allowed number at every turn (O(range) a turn, a MemoryError
  here), and `GuessEnv` itself took minutes at a range of 20000: `--high 100000 --policies
  bisect --noise` hung past the episode guard."""
  bench = load_bench("critic_ceiling")
  assert bench.POLICIES["bisect"]((), 1, 10**12) == {500_000_000_000: 1.0}
  assert bench.POLICIES["bisect"](((500_000_000_000, True),), 1, 10**12) == {750_000_000_000: 1.0}
  env = GuessEnv(1, 100_000, 4, turn_penalty=0.2, valid_reward=0.1)
  assert env.max_return == pytest.approx(1.1)
