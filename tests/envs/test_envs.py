"""The text-environment protocol, output validation, and `MemoryEnv`'s rules and baselines."""

import math

import numpy as np
import pytest

from tests.helpers.envs import play
from tunix_ppo_ext._src.data.char_tokenizer import DEFAULT_ALPHABET
from tunix_ppo_ext._src.envs.base import make_env, validate_reset_output, validate_step_output
from tunix_ppo_ext._src.envs.memory import MemoryEnv
from tunix_ppo_ext._src.plugins import registry
from tunix_ppo_ext._src.plugins.protocols import Environment

pytestmark = pytest.mark.fast


def optimal(env, observation):
  return env.optimal_action()


@pytest.mark.parametrize("num_symbols,num_turns", [(3, 2), (5, 3), (25, 4)])
def test_optimal_policy_reaches_max_return(num_symbols, num_turns):
  env = MemoryEnv(num_symbols=num_symbols, num_turns=num_turns)
  assert env.max_return == pytest.approx((num_turns - 1) * 0.25 + 1.0)
  for seed in range(20):
    _, rewards, infos = play(env, seed, optimal)
    assert len(rewards) == num_turns
    assert sum(rewards) == pytest.approx(env.max_return)
    assert all(info["correct"] for info in infos) and infos[-1]["success"] is True


def test_rewards_observations_and_termination():
  env = MemoryEnv(num_symbols=3, num_turns=3)
  observation, info = env.reset(seed=0)
  symbol = observation[len("see ")]
  assert observation == f"see {symbol}!" and symbol in "abc" and info == {}
  assert env.step("k") == ("wait.", 0.25, False, False, {"correct": True, "expected": "k"})
  wrong_ack = "x"
  assert env.step(wrong_ack) == ("what?", 0.0, False, False, {"correct": False, "expected": "k"})
  wrong = "a" if symbol != "a" else "b"
  recall_info = {"correct": False, "expected": symbol, "success": False}  # success: recall only
  assert env.step(wrong) == ("", 0.0, True, False, recall_info)
  env.reset(seed=0)
  env.step("k")
  env.step("k")
  assert env.step(symbol)[1:3] == (1.0, True)


def test_replies_are_compared_exactly():
  env = MemoryEnv()
  env.reset(seed=1)
  for reply in ["k ", "kk", "K", ""]:
    assert env.step(reply)[1] == 0.0
    env.reset(seed=1)


def test_partial_credit_pays_a_right_start():
  env = MemoryEnv(partial_credit=0.5)
  observation, _ = env.reset(seed=3)
  symbol = observation[len("see ")]
  assert env.step("kx")[1] == 0.125
  assert env.step(symbol + symbol)[1:3] == (0.5, True)
  with pytest.raises(ValueError, match="partial_credit"):
    MemoryEnv(partial_credit=1.5)


def test_deterministic_given_seed_and_all_symbols_drawn():
  env, other = MemoryEnv(num_symbols=4), MemoryEnv(num_symbols=4)
  firsts = [env.reset(seed=s)[0] for s in range(50)]
  assert firsts == [other.reset(seed=s)[0] for s in range(50)]
  assert {f[len("see ")] for f in firsts} == set("abcd")


def test_random_policies_score_low():
  env = MemoryEnv()  # 3 symbols, 2 turns, max_return 1.25
  rng = np.random.default_rng(0)
  alphabet = list(DEFAULT_ALPHABET)
  replies = list(env.symbols + env.ACK)

  def uniform_char(env, observation):
    return str(rng.choice(alphabet))

  def uniform_reply(env, observation):
    return str(rng.choice(replies))

  char_return = np.mean([sum(play(env, s, uniform_char)[1]) for s in range(2000)])
  reply_return = np.mean([sum(play(env, s, uniform_reply)[1]) for s in range(2000)])
  # Expected: 1.25 / 96 = 0.013 for a random character; 0.25/4 + 1/4 = 0.3125 for a random
  # reply among the four the env accepts (25% of max_return).
  assert char_return < 0.05 * env.max_return
  assert reply_return == pytest.approx(0.3125, abs=0.04)


def test_misuse_raises():
  env = MemoryEnv()
  with pytest.raises(RuntimeError, match="reset"):
    env.step("k")
  env.reset(seed=0)
  env.step("k")
  env.step("a")
  with pytest.raises(RuntimeError, match="reset"):
    env.step("a")
  with pytest.raises(ValueError, match="num_symbols"):
    MemoryEnv(num_symbols=1)
  with pytest.raises(ValueError, match="num_turns"):
    MemoryEnv(num_turns=1)
  # a float or a string is refused by the same check as stash's (2.5 turns never recall)
  with pytest.raises(ValueError, match=r"num_turns=2.5 is invalid: must be an integer >= 2"):
    MemoryEnv(num_turns=2.5)
  with pytest.raises(ValueError, match=r"num_symbols='3' is invalid"):
    MemoryEnv(num_symbols="3")
  with pytest.raises(
    ValueError, match=r"num_symbols=26 is invalid: must be an integer in \[2, 25\]"
  ):
    MemoryEnv(num_symbols=26)
  with pytest.raises(ValueError, match=r"recall_reward=inf is invalid"):
    MemoryEnv(recall_reward=float("inf"))


def test_registry_and_protocol():
  assert registry.RegistryView(registry.ENVIRONMENTS)["memory"] is MemoryEnv
  env = make_env("memory", num_symbols=5, num_turns=3)
  assert isinstance(env, MemoryEnv) and isinstance(env, Environment)
  assert env.name == "memory" and env.symbols == "abcde"
  assert isinstance(make_env(MemoryEnv), MemoryEnv)
  with pytest.raises(ValueError, match="unknown environment 'nope'"):
    make_env("nope")


@pytest.mark.parametrize(
  "output,problem",
  [
    (("obs", 1.0, False, False), "got 4"),
    ("obs", "not a tuple"),
    ((3, 1.0, False, False, {}), "observation must be a str"),
    (("obs", "1.0", False, False, {}), "reward must be a real number"),
    (("obs", True, False, False, {}), "reward must be a real number"),
    (("obs", None, False, False, {}), "reward must be a real number"),
    (("obs", math.nan, False, False, {}), "reward must be finite"),
    (("obs", np.float32(np.inf), False, False, {}), "reward must be finite"),
    (("obs", 1.0, 0, False, {}), "terminated must be a bool"),
    (("obs", 1.0, False, "no", {}), "truncated must be a bool"),
    (("obs", 1.0, False, False, None), "info must be a dict"),
  ],
)
def test_malformed_step_output_names_env_and_turn(output, problem):
  with pytest.raises(ValueError, match=rf"environment 'grid', turn 3: .*{problem}"):
    validate_step_output("grid", 3, output)


def test_valid_outputs_are_normalised():
  out = validate_step_output("grid", 1, ["o", np.float32(0.5), np.bool_(True), False, {}])
  assert out == ("o", 0.5, True, False, {})
  assert type(out[1]) is float and type(out[2]) is bool
  assert validate_step_output("grid", 1, ("o", 2, False, False, {}))[1] == 2.0
  assert validate_reset_output("grid", ("o", {})) == ("o", {})
  with pytest.raises(ValueError, match="environment 'grid', turn 0: reset must return"):
    validate_reset_output("grid", "o")
  with pytest.raises(ValueError, match="turn 0: observation must be a str"):
    validate_reset_output("grid", (None, {}))


def test_anchor_key_is_the_environment_s_or_the_exact_history():
  """GiGPO's anchors: an environment without `anchor()` is keyed by its token history; one
  with it by its key (never equal to a history); an unhashable key names the environment."""
  from tunix_ppo_ext._src.envs.base import anchor_key

  memory = MemoryEnv()
  assert anchor_key(memory, 2, (1, 2, 3)) == (1, 2, 3)

  class Keyed(MemoryEnv):
    def anchor(self):
      return ("room", 3)

  assert anchor_key(Keyed(), 1, (1, 2)) == ("anchor", ("room", 3))
  assert anchor_key(Keyed(), 1, (0,)) != anchor_key(memory, 1, (0,))

  class Unhashable(MemoryEnv):
    name = "unhashable"

    def anchor(self):
      return ["room"]

  with pytest.raises(ValueError, match=r"'unhashable', turn 4: anchor\(\) must return a hashable"):
    anchor_key(Unhashable(), 4, ())
