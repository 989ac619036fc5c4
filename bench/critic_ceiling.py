"""How much of `guess`'s returns any critic could explain: the explained variance of the best
value function that sees the conversation, for scripted policies, computed exactly.

  python bench/critic_ceiling.py [--high 10] [--max-turns 4] [--turn-penalty 0.2]
                                 [--valid-reward 0.1] [--noise] [--lambdas 0 0.5 0.95 1]
                                 [--group 4]

A critic sees the conversation so far (the guesses and the "Higher"/"Lower" answers), never
the secret. The best it can do at a turn is the mean return-to-go over every secret and
every continuation the policy could still produce from that conversation, E[G | history];
what is left, Var[G | history], no training removes. This script enumerates every secret
and every guess sequence of four scripted policies, with their probabilities, plays each
through `GuessEnv` (the game's own rewards), and prints per policy:

- the success rate and mean return (the policy's level);
- `ceiling`: `1 - E[Var(G | history)] / Var(G)`, the explained variance of E[G | history],
  the highest `critic/explained_variance` a critic can reach on that policy's episodes
  with lambda-1 (Monte Carlo) targets and the value read once a turn, as
  `configs/smollm2_ppo.yaml` has it (gamma 1; every turn of every episode weighs the same,
  where the run weighs a turn by its 2-6 agent tokens);
- `told the secret`: the same for a value function that also knows the secret (what a
  GRPO group of one secret shares), for comparison.

With `--noise`, a second table: the advantages' noise per agent turn, `E[A^2]` over every
turn of every episode (each turn weighing the same, as `actor/advantage_sq_mean_turn`
weighs them), in the rewards' units:
- `critic, lambda L`: turn-level GAE (gamma 1) over the perfect critic's values
  `V(history) = E[G | history]`, `A_t = sum_k L^k delta_{t+k}`, `delta_t = r_t +
  V(h_{t+1}) - V(h_t)` with 0 after the last turn; lambda 1 is `G_t - V(h_t)`;
- `grpo, n`: every turn of an episode takes the episode's `G - mean(G of its group)`, the
  group being `--group` episodes of the same secret (`norm_adv_by_std: false`): `E[(G -
  mean)^2 | G] = ((n-1)/n)^2 ((G - mu_s)^2 + sigma_s^2 / (n-1))` for the secret's mean
  `mu_s` and variance `sigma_s^2`;
- `rloo, n`: the leave-one-out baseline, `(G - mu_s)^2 + sigma_s^2 / (n-1)`.
Enumeration grows as `high^max_turns` for the policies that ignore the feedback and about
as fast for `consistent` (32 and 5: 32528704 episodes); 10 and 4 take seconds. A run that
would enumerate more than 10^6 episodes is refused (`bisect` plays one per secret, in time
about linear in `--high`: 12 s for `--high 30000 --policies bisect --noise`, most of it
drawing a reset seed for every secret).

The policies, each answering a number in range every turn:
- `uniform`: any number, ignoring the feedback (the issue's 34% baseline);
- `fresh`: any number not guessed before, ignoring the feedback (40%);
- `consistent`: any number the feedback so far allows (uses the feedback, at random);
- `bisect`: the middle of what the feedback allows (binary search: 100% at 10 and 4).
"""

from __future__ import annotations

import argparse
import functools
import re
from collections import defaultdict
from collections.abc import Callable, Sequence

import numpy as np

from tunix_ppo_ext.envs import GuessEnv

# a policy: (history of (guess, secret is higher: bool | None), low, high) -> {guess: prob}
Policy = Callable[[tuple, int, int], dict[int, float]]


def _allowed(history: tuple, low: int, high: int) -> range:
  """The numbers the feedback so far allows (a range: `bisect` takes its middle without
  listing them)."""
  lo, hi = low, high
  for guess, higher in history:
    lo, hi = (max(lo, guess + 1), hi) if higher else (lo, min(hi, guess - 1))
  return range(lo, hi + 1)


def _uniform_over(numbers: Sequence[int]) -> dict[int, float]:
  return {n: 1.0 / len(numbers) for n in numbers}


def _fresh(history: tuple, low: int, high: int) -> dict[int, float]:
  guessed = {guess for guess, _ in history}
  return _uniform_over([n for n in range(low, high + 1) if n not in guessed])


def _bisect(history: tuple, low: int, high: int) -> dict[int, float]:
  allowed = _allowed(history, low, high)
  return {allowed[(len(allowed) - 1) // 2]: 1.0}


MAX_EPISODES = 10**6  # the most episodes a run enumerates


def episode_count(policy: str, high: int, max_turns: int) -> int:
  """How many episodes `_episodes` enumerates for `policy` on 1..`high`: exact for
  `consistent` and `bisect`, at most `high^max_turns` per secret for the feedback-blind
  policies."""
  if policy == "bisect":
    return high
  if policy != "consistent":
    return high ** (max_turns + 1)  # at most high^max_turns sequences per secret

  @functools.cache
  def count(low: int, top: int, secret: int, turns: int) -> int:
    total = 0
    for guess in range(low, top + 1):
      if guess == secret or turns == 1:
        total += 1
      else:
        total += count(
          *((guess + 1, top) if guess < secret else (low, guess - 1)), secret, turns - 1
        )
    return total

  return sum(count(1, high, secret, max_turns) for secret in range(1, high + 1))


POLICIES: dict[str, Policy] = {
  "uniform": lambda history, low, high: _uniform_over(list(range(low, high + 1))),
  "fresh": _fresh,
  "consistent": lambda history, low, high: _uniform_over(_allowed(history, low, high)),
  "bisect": _bisect,
}


def _seed_for_each_secret(env: GuessEnv) -> dict[int, int]:
  """A reset seed for every secret (the env draws its secret from the seed)."""
  seeds: dict[int, int] = {}
  seed = 0
  while len(seeds) < env.high - env.low + 1:
    env.reset(seed)
    seeds.setdefault(int(env.optimal_action()), seed)
    seed += 1
  return seeds


def _episodes(env: GuessEnv, policy: Policy):
  """Yields (secret, probability, [(history, reward) per turn], success) for every episode."""
  seeds = _seed_for_each_secret(env)
  prior = 1.0 / len(seeds)

  def grow(secret: int, guesses: tuple, prob: float):
    env.reset(seeds[secret])
    turns, history, done, info = [], (), False, {}
    for guess in guesses:
      _, reward, done, _, info = env.step(str(guess))
      turns.append((history, reward))
      history += ((guess, guess < secret if guess != secret else None),)
    if done:
      yield secret, prob, turns, bool(info.get("success"))
      return
    for guess, p in policy(history, env.low, env.high).items():
      yield from grow(secret, (*guesses, guess), prob * p)

  for secret in seeds:
    yield from grow(secret, (), prior)


def _ceiling(points: list[tuple[object, float, float]]) -> float:
  """`1 - E[Var(G | key)] / Var(G)` over weighted (key, weight, return-to-go) points."""
  weights = np.array([w for _, w, _ in points])
  returns = np.array([g for _, _, g in points])
  total = np.average((returns - np.average(returns, weights=weights)) ** 2, weights=weights)
  groups: dict[object, list[int]] = defaultdict(list)
  for i, (key, _, _) in enumerate(points):
    groups[key].append(i)
  within = 0.0
  for members in groups.values():
    w, g = weights[members], returns[members]
    within += w.sum() * np.average((g - np.average(g, weights=w)) ** 2, weights=w)
  return float(1.0 - within / weights.sum() / total)


def describe(env: GuessEnv, policy: Policy) -> dict[str, float]:
  """Success, mean return and the two explained-variance ceilings of one policy."""
  seen, told, success, mean_return = [], [], 0.0, 0.0
  for secret, prob, turns, won in _episodes(env, policy):
    rewards = np.array([r for _, r in turns])
    to_go = np.cumsum(rewards[::-1])[::-1]  # gamma 1: the Monte Carlo return from each turn
    for (history, _), g in zip(turns, to_go, strict=True):
      seen.append((history, prob, g))
      told.append(((history, secret), prob, g))
    success += prob * won
    mean_return += prob * to_go[0]
  return {
    "success": success,
    "return": mean_return,
    "ceiling": _ceiling(seen),
    "told the secret": _ceiling(told),
  }


def noise(env: GuessEnv, policy: Policy, lambdas: list[float], group: int) -> dict[str, float]:
  """Per-turn `E[A^2]`: the perfect critic's turn-level GAE at each lambda, GRPO's and
  RLOO's over `group` episodes of one secret (the module's docstring has the formulas)."""
  episodes = list(_episodes(env, policy))
  sums: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0.0])  # history -> (w, w * G)
  secrets: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])  # w, wG, wG^2
  for secret, prob, turns, _ in episodes:
    to_go = np.cumsum([r for _, r in turns][::-1])[::-1]
    for (history, _), g in zip(turns, to_go, strict=True):
      sums[history][0] += prob
      sums[history][1] += prob * g
    moments = secrets[secret]
    for k, value in enumerate((prob, prob * to_go[0], prob * to_go[0] ** 2)):
      moments[k] += value
  value = {h: wg / w for h, (w, wg) in sums.items()}
  totals = defaultdict(float)
  weight = 0.0
  for secret, prob, turns, _ in episodes:
    rewards = [r for _, r in turns]
    values = [value[h] for h, _ in turns] + [0.0]
    deltas = [r + values[t + 1] - values[t] for t, r in enumerate(rewards)]
    w, wg, wg2 = secrets[secret]
    mu, var = wg / w, max(wg2 / w - (wg / w) ** 2, 0.0)
    spread = (sum(rewards) - mu) ** 2 + var / max(group - 1, 1)
    for t in range(len(rewards)):
      for lam in lambdas:
        advantage = sum(lam**k * d for k, d in enumerate(deltas[t:]))
        totals[f"critic, lambda {lam:g}"] += prob * advantage**2
      totals[f"grpo, {group}"] += prob * ((group - 1) / group) ** 2 * spread
      totals[f"rloo, {group}"] += prob * spread
    weight += prob * len(rewards)
  return {name: total / weight for name, total in totals.items()}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--high", type=int, default=10)
  parser.add_argument("--max-turns", type=int, default=4)
  parser.add_argument("--turn-penalty", type=float, default=0.2)
  parser.add_argument("--valid-reward", type=float, default=0.1)
  parser.add_argument("--noise", action="store_true", help="the advantages' noise table")
  parser.add_argument("--lambdas", type=float, nargs="+", default=[0.0, 0.5, 0.95, 1.0])
  parser.add_argument("--group", type=int, default=4, help="GRPO's samples of one secret")
  parser.add_argument("--policies", nargs="+", choices=sorted(POLICIES), default=list(POLICIES))
  args = parser.parse_args()
  if args.group < 2:
    parser.error(f"--group {args.group}: a group baseline needs at least 2 samples")
  bad = [lam for lam in args.lambdas if not 0.0 <= lam <= 1.0]  # NaN fails both
  if bad:
    parser.error(f"--lambdas {bad[0]}: a GAE lambda is a number in [0, 1]")
  try:
    env = GuessEnv(1, args.high, args.max_turns, args.turn_penalty, args.valid_reward)
  except ValueError as err:  # GuessEnv names its argument: the option's name instead
    parser.error(re.sub(r"^(\w+)=", lambda m: f"--{m.group(1).replace('_', '-')} ", str(err)))
  large = {name: episode_count(name, args.high, args.max_turns) for name in args.policies}
  large = {name: count for name, count in large.items() if count > MAX_EPISODES}
  if large:
    listed = ", ".join(f"{name} {count}" for name, count in large.items())
    parser.error(
      f"--policies {' '.join(large)}: episodes to enumerate (at most) at --high {args.high} "
      f"--max-turns {args.max_turns}: {listed}, above this script's {MAX_EPISODES}; use "
      "--policies bisect, "
      "or a smaller --high or --max-turns"
    )
  if args.noise:
    rows = {name: noise(env, POLICIES[name], args.lambdas, args.group) for name in args.policies}
    columns = list(next(iter(rows.values())))
    print("| policy | " + " | ".join(columns) + " |")
    print("| --- |" + " --- |" * len(columns))
    for name, row in rows.items():
      print(f"| {name} | " + " | ".join(f"{row[c]:.4f}" for c in columns) + " |")
    return
  print("| policy | success | mean return | ceiling | told the secret |")
  print("| --- | --- | --- | --- | --- |")
  for name in args.policies:
    policy = POLICIES[name]
    row = describe(env, policy)
    print(
      f"| {name} | {row['success']:.3f} | {row['return']:.3f} | {row['ceiling']:.3f} "
      f"| {row['told the secret']:.3f} |"
    )


if __name__ == "__main__":
  main()
