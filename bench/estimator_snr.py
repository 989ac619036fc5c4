"""Every advantage estimator on the same batches of `guess`: its noise on one scale, the
true advantage's size, and its policy gradient's signal-to-noise ratio against GRPO's.

  python bench/estimator_snr.py [--high 10] [--max-turns 4] [--info-gain 0.0]
                                [--policy uniform] [--batches 64] [--continuations 32]
                                [--secrets 2] [--group 4] [--seed 0]

A scripted stochastic policy (`bench/critic_ceiling.py`'s `uniform` or `consistent`, as a
tabular softmax over the numbers with all logits 0, restricted to what the feedback allows
for `consistent`) plays `GuessEnv` (the game's own rewards) in batches of `--secrets`
secrets x `--group` episodes. Each episode becomes a row of the package's own layout (one
agent token a turn, an observation token between turns, the turn's reward on its token),
and every estimator runs on the same rows through `tunix_ppo_ext.ops`:
- `grpo` (group mean, raw and std-divided as trained), `rloo`, `gigpo` (anchors from
  `GuessEnv.anchor()`, the std-divided default as trained), `reinforce_plus_plus`;
- `exact critic, lambda L`: turn-level GAE (`ops.compute_turn_gae_advantages`) over the
  perfect secret-blind critic, `V(history) = E[G | history]` by enumeration (games small
  enough for `critic_ceiling.py`);
- `MC critic (N), lambda L`: the same over a Monte Carlo oracle, `V(history)` the mean
  return-to-go of `--continuations` N fresh continuations of the policy from that history
  (the secret drawn again from those the history allows; `--continuations 0`: none), whose
  own sampling error adds about `2 Var(G | h) / N` to each TD error's square;
- `critic EV E, error fixed per history, lambda L` (`--critic-ev E`, games that enumerate):
  a learned critic's stand-in, the exact critic plus an error `sigma z(h)`, `z(h)` drawn
  once per history and kept for the run (a critic that errs the same way on every visit),
  `sigma` set so that the critic explains the share `E` of the return-to-go's variance over
  the visited turns; `..., error fresh each visit, ...`: the same `sigma`, drawn anew at
  every visit.

Per estimator, over every agent turn of every batch: `noise` `E[(A / c)^2]` (`c` the signal
coefficient, `tunix_ppo_ext.metrics.signal_coefficients`), on the true advantage's scale; and `SNR`
of the batch policy gradient `g = sum_turns A grad log pi(a|s)` (the tabular softmax's
exact score function) divided by `c`, relative to GRPO's as trained: divided by their
signal coefficients every estimator's gradient has the same expectation (the true policy
gradient), so the ratio of SNRs `|E g|^2 / E|g - E g|^2` is the inverse ratio of their
noise `E|g - E g|^2` over batches (estimating `|E g|^2` itself, small next to the noise,
would add error to every row). That holds for an estimator without bias; a critic's
error that depends on the state it bootstraps from (lambda < 1) biases the gradient, which
no batch averages away. So, where the exact critic exists, `gradient error` is
`E|g - g*|^2` relative to GRPO's as trained (`g*` the mean gradient over the batches of the
exact critic at the first `--lambdas`, unbiased: smaller is better) and `bias share` is
`|E g - g*|^2` over it. `EV` is each critic's explained variance of the return-to-go over
the visited turns. The `grpo (raw)`, `rloo` and
`exact critic` rows' raw `E[A^2]` are printed beside `critic_ceiling.py --noise`'s exact
figures for the same game and policy, with Monte Carlo standard errors. `signal` is the
true advantage's `E[A*^2]` per visited turn, `A*(h, a) = Q(h, a) - V(h)` with `Q`
averaged over the secrets the history allows (exact values; games small enough to
enumerate).

The issue's form on SmolLM2 checkpoints (64 batches of the real model, 32 continuations of
the model per visited history) needs an accelerator: on the 2-core CPU one batch's
continuations alone take about 15 minutes. This script is the same measurement on a policy
whose score function is exact, so that the estimators and the metric are checked against
the enumeration.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys
from collections import defaultdict
from typing import Any

import numpy as np

from tunix_ppo_ext import ops
from tunix_ppo_ext.envs import GuessEnv
from tunix_ppo_ext.metrics import signal_coefficients

HERE = pathlib.Path(__file__).resolve().parent


def _ceiling_module() -> Any:
  spec = importlib.util.spec_from_file_location("critic_ceiling", HERE / "critic_ceiling.py")
  module = importlib.util.module_from_spec(spec)
  sys.modules["critic_ceiling"] = module
  spec.loader.exec_module(module)
  return module


CEILING = _ceiling_module()


def allowed(history: tuple, low: int, high: int) -> list[int]:
  return CEILING._allowed(history, low, high)


def choices(policy: str, history: tuple, low: int, high: int) -> list[int]:
  """The numbers the tabular policy samples uniformly from (all logits 0)."""
  return list(range(low, high + 1)) if policy == "uniform" else allowed(history, low, high)


def play(env: GuessEnv, seed: int, policy: str, rng: np.random.Generator, prefix=()) -> dict:
  """One episode from `seed` (replaying `prefix` guesses first): per turn the history, the
  guess, the reward, the numbers sampled from and the anchor."""
  env.reset(seed)
  secret = int(env.optimal_action())
  turns, history, done = [], (), False
  while not done:
    options = choices(policy, history, env.low, env.high)
    guess = prefix[len(turns)] if len(turns) < len(prefix) else int(rng.choice(options))
    anchor = env.anchor()
    _, reward, done, _, _ = env.step(str(guess))
    turns.append({"history": history, "guess": guess, "reward": reward, "options": options})
    turns[-1]["anchor"] = anchor
    history += ((guess, guess < secret if guess != secret else None),)
  return {"secret": secret, "turns": turns}


def oracle_value(env, seeds, policy, history, continuations, rng) -> float:
  """A secret-blind Monte Carlo value of `history`: mean return-to-go of continuations,
  each from a secret drawn among those the history allows."""
  possible = [s for s in seeds if _consistent(history, s)]
  total = 0.0
  for _ in range(continuations):
    secret = possible[rng.integers(len(possible))]
    episode = play(env, seeds[secret], policy, rng, prefix=tuple(g for g, _ in history))
    total += sum(t["reward"] for t in episode["turns"][len(history) :])
  return total / continuations


def exact_values(env: GuessEnv, policy: str) -> dict[tuple, float] | None:
  """`E[G | history]` of every history, by enumeration (`critic_ceiling.py`'s episodes);
  None when the game has more episodes than that script enumerates."""
  if CEILING.episode_count(policy, env.high, env.max_turns) > CEILING.MAX_EPISODES:
    return None
  sums: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0.0])
  for _, prob, turns, _ in CEILING._episodes(env, CEILING.POLICIES[policy]):
    to_go = np.cumsum([r for _, r in turns][::-1])[::-1]
    for (history, _), g in zip(turns, to_go, strict=True):
      sums[history][0] += prob
      sums[history][1] += prob * g
  return {h: wg / w for h, (w, wg) in sums.items()}


def true_advantage(env, seeds, known, history: tuple, guess: int) -> float:
  """`Q(h, a) - V(h)`: the guess's reward plus the next history's exact value, averaged
  over the secrets `history` allows (uniform: the policy's guesses ignore the secret)."""
  total, possible = 0.0, [s for s in seeds if _consistent(history, s)]
  for secret in possible:
    env.reset(seeds[secret])
    for g, _ in history:
      env.step(str(g))
    _, reward, done, _, _ = env.step(str(guess))
    after = history + ((guess, guess < secret if guess != secret else None),)
    total += reward + (0.0 if done else known[after])
  return total / len(possible) - known[history]


def _consistent(history: tuple, secret: int) -> bool:
  return all(
    (higher is None) == (g == secret) and (higher is None or higher == (g < secret))
    for g, higher in history
  )


def rows(episodes: list[dict], values: list[list[float]] | None, width: int):
  """The package's layout: agent token `2k`, observation token `2k+1`."""
  b = len(episodes)
  mask, rewards, vals = (np.zeros((b, width), np.float32) for _ in range(3))
  for i, episode in enumerate(episodes):
    for k, turn in enumerate(episode["turns"]):
      mask[i, 2 * k] = 1.0
      rewards[i, 2 * k] = turn["reward"]
      if values is not None:
        vals[i, 2 * k] = values[i][k]
  return mask, rewards, vals


def score_vectors(episode: dict, high: int) -> np.ndarray:
  """`[K, high]` the tabular softmax's `grad log pi(guess)` per turn (logits 0)."""
  out = np.zeros((len(episode["turns"]), high))
  for k, turn in enumerate(episode["turns"]):
    out[k, np.array(turn["options"]) - 1] -= 1.0 / len(turn["options"])
    out[k, turn["guess"] - 1] += 1.0
  return out


def estimators(
  args, mask, rewards, critics, groups, anchors
) -> dict[str, tuple[np.ndarray, str, bool]]:
  """`{row name: (advantages [B, T], estimator for its signal coefficient, std division)}`;
  `critics`: `{name: values [B, T]}` of the critics turn-level GAE reads."""
  scores = (rewards * mask).sum(-1)
  found = {
    "grpo (raw)": (
      ops.compute_grpo_advantages(scores, groups, mask, norm_by_std=False),
      "grpo",
      False,
    ),
    "grpo (as trained)": (ops.compute_grpo_advantages(scores, groups, mask), "grpo", True),
    "rloo": (ops.compute_rloo_advantages(scores, groups, mask), "rloo", False),
    "gigpo (as trained)": (
      ops.compute_gigpo_advantages(rewards, mask, groups, anchors, 1.0, 1.0, True),
      "gigpo",
      True,
    ),
    "reinforce_plus_plus": (
      ops.compute_reinforce_plus_plus_advantages(rewards, mask, 1.0)[0],
      "reinforce_plus_plus",
      False,
    ),
  }
  for critic, values in critics.items():
    for lam in args.lambdas:
      adv, _ = ops.compute_turn_gae_advantages(rewards, values, mask, 1.0, lam, whiten=False)
      found[f"{critic}, lambda {lam:g}"] = (adv, "turn_gae", False)
  return {k: (np.asarray(a, np.float64), name, std) for k, (a, name, std) in found.items()}


def error_scale(env: GuessEnv, policy: str, known: dict[tuple, float], ev: float) -> float:
  """`sigma` of a value error independent of the return that brings the exact critic's
  explained variance of the return-to-go, over the turns as often as they are visited, down
  to `ev`: `Var(G - V* - e) = Var(G - V*) + sigma^2 = (1 - ev) Var(G)`."""
  weight, to_go, value = [], [], []
  for _, prob, turns, _ in CEILING._episodes(env, CEILING.POLICIES[policy]):
    returns = np.cumsum([r for _, r in turns][::-1])[::-1]
    for (history, _), g in zip(turns, returns, strict=True):
      weight.append(prob)
      to_go.append(g)
      value.append(known[history])
  w, g, v = (np.array(x, np.float64) for x in (weight, to_go, value))

  def var(x: np.ndarray) -> float:
    return float(np.average((x - np.average(x, weights=w)) ** 2, weights=w))

  extra = (1.0 - ev) * var(g) - var(g - v)
  if extra < 0:
    raise SystemExit(f"--critic-ev {ev}: the exact critic explains {1 - var(g - v) / var(g):.3f}")
  return float(np.sqrt(extra))


def _value_error(history: tuple, fixed: dict[tuple, float] | None, rng) -> float:
  """A standard normal error of `history`'s value: drawn once and kept in `fixed`, or
  anew at each call (`fixed` None)."""
  if fixed is None:
    return float(rng.standard_normal())
  if history not in fixed:
    fixed[history] = float(rng.standard_normal())
  return fixed[history]


def _critics(args, env, seeds, known, episodes, rng, errors) -> dict[str, np.ndarray]:
  """The values `[B, T]` of the exact critic (when the game enumerates), of the Monte
  Carlo one (with `--continuations`) and of the exact one with errors (`errors`: `{EV:
  (sigma, {history: z})}` of `--critic-ev`, and their generator under `"rng"`), in the
  rows' layout."""
  width, critics = 2 * args.max_turns, {}
  if known is not None:
    exact_v = [[known[t["history"]] for t in e["turns"]] for e in episodes]
    critics["exact critic"] = rows(episodes, exact_v, width)[2]
  for ev, (sigma, fixed) in ((k, v) for k, v in errors.items() if k != "rng"):
    for kind, table in (("fixed per history", fixed), ("fresh each visit", None)):
      v = [
        [
          known[t["history"]] + sigma * _value_error(t["history"], table, errors["rng"])
          for t in e["turns"]
        ]
        for e in episodes
      ]
      critics[f"critic EV {ev:g}, error {kind}"] = rows(episodes, v, width)[2]
  if args.continuations:
    mc = [
      [
        oracle_value(env, seeds, args.policy, t["history"], args.continuations, rng)
        for t in e["turns"]
      ]
      for e in episodes
    ]
    critics[f"MC critic ({args.continuations})"] = rows(episodes, mc, width)[2]
  return critics


def _anchors(episodes: list[dict], turns: int) -> np.ndarray:
  """`[B, K]` the turns' `GuessEnv.anchor()` keys as ids (-1 past an episode's end)."""
  table: dict[Any, int] = {}
  anchors = np.full((len(episodes), turns), -1, np.int64)
  for i, e in enumerate(episodes):
    for k, t in enumerate(e["turns"]):
      anchors[i, k] = table.setdefault(t["anchor"], len(table))
  return anchors


def run(args) -> dict[str, dict[str, float]]:
  """Every estimator on `--batches` batches: per-turn noise on one scale, raw `E[A^2]`,
  the batch gradients (SNR, and error against the exact gradient where it exists), each
  critic's explained variance and the true advantage's `E[A*^2]`."""
  env = GuessEnv(1, args.high, args.max_turns, 0.2, 0.1, info_gain_reward=args.info_gain)
  seeds = CEILING._seed_for_each_secret(env)
  rng = np.random.default_rng(args.seed)
  known = exact_values(env, args.policy)
  errors = _errors(args, env, known)
  noise, raw, grads, fits = (defaultdict(list) for _ in range(4))
  groups = np.repeat(np.arange(args.secrets), args.group)
  for _ in range(args.batches):
    secrets = rng.choice(sorted(seeds), size=args.secrets, replace=False)
    episodes = [
      play(env, seeds[int(s)], args.policy, rng) for s in secrets for _ in range(args.group)
    ]
    critics = _critics(args, env, seeds, known, episodes, rng, errors)
    if known is not None:
      visited = [t for e in episodes for t in e["turns"]]
      signal_sq = (
        np.array([true_advantage(env, seeds, known, t["history"], t["guess"]) for t in visited])
        ** 2
      )
      noise["signal E[A*^2]"].extend(signal_sq.tolist())
      raw["signal E[A*^2]"].append(signal_sq)
    mask, rewards, _ = rows(episodes, None, 2 * args.max_turns)
    terms = {
      "rewards": rewards,
      "mask": mask,
      "groups": groups,
      "step_weight": 1.0,
      "gamma_turn": 1.0,
    }
    terms["anchors"] = _anchors(episodes, args.max_turns)
    terms["returns"] = np.asarray(ops.compute_reinforce_plus_plus_advantages(rewards, mask, 1.0)[1])
    agent = mask[:, 0::2] > 0
    for critic, values in critics.items():
      fits[critic].append((terms["returns"][:, 0::2][agent], values[:, 0::2][agent]))
    scores = [score_vectors(e, args.high) for e in episodes]
    found = estimators(args, mask, rewards, critics, groups, terms["anchors"])
    for row, (adv, name, std) in found.items():
      terms["advantages_raw"] = adv
      c = signal_coefficients(name, terms, std_division=std, whiten=False)
      scaled = np.where(c != 0, adv / np.where(c != 0, c, 1.0), 0.0)
      noise[row].extend((scaled[:, 0::2][agent] ** 2).tolist())
      raw[row].append(adv[:, 0::2][agent] ** 2)
      grads[row].append(sum(scaled[i, 0 : 2 * len(g) : 2] @ g for i, g in enumerate(scores)))
  return _summary(args, noise, raw, grads, fits)


def _errors(args, env: GuessEnv, known) -> dict[Any, Any]:
  """`{EV: (sigma, {})}` for each `--critic-ev` (`error_scale`), and under `"rng"` the
  errors' own generator (the batches stay those of a run without them)."""
  evs = getattr(args, "critic_ev", None) or []
  if evs and known is None:
    raise SystemExit("--critic-ev needs a game small enough to enumerate (the exact critic)")
  errors: dict[Any, Any] = {ev: (error_scale(env, args.policy, known, ev), {}) for ev in evs}
  return errors | {"rng": np.random.default_rng([args.seed, 1])}


def _summary(args, noise, raw, grads, fits) -> dict[str, dict[str, float]]:
  """Each row's figures (`run`): the gradient's error against `g*`, the mean gradient of
  the exact critic at the first `--lambdas`, where that row exists."""
  grpo = _spread(grads["grpo (as trained)"])
  reference = grads.get(f"exact critic, lambda {args.lambdas[0]:g}")
  exact = None if reference is None else np.mean(reference, axis=0)
  grpo_error = None if exact is None else _error(grads["grpo (as trained)"], exact)
  out = {}
  for row in noise:
    m = {"noise": float(np.mean(noise[row])), **_per_turn_mean(raw[row])}
    m["snr_vs_grpo"] = grpo / _spread(grads[row]) if row in grads else float("nan")
    m["error_vs_grpo"] = m["bias_share"] = float("nan")
    if exact is not None and row in grads:
      m["error_vs_grpo"] = _error(grads[row], exact) / grpo_error
      bias = np.sum((np.mean(grads[row], axis=0) - exact) ** 2)
      m["bias_share"] = float(bias / _error(grads[row], exact))
    critic = row.rsplit(", lambda", 1)[0]
    if critic in fits:
      returns, values = (np.concatenate(x) for x in zip(*fits[critic], strict=True))
      m["ev"] = float(1.0 - np.var(returns - values) / np.var(returns))
    out[row] = m
  return out


def _error(batch_grads: list[np.ndarray], exact: np.ndarray) -> float:
  """`E|g - g*|^2` over batches: the batch gradient's noise and bias together."""
  return float(np.mean(np.sum((np.array(batch_grads) - exact) ** 2, axis=1)))


def _per_turn_mean(batches: list[np.ndarray]) -> dict[str, float]:
  """The mean over every turn of every batch, and its standard error from the batches
  (a ratio estimator: turns of one episode or group are not independent)."""
  sums = np.array([b.sum() for b in batches])
  counts = np.array([b.size for b in batches], np.float64)
  mean = sums.sum() / counts.sum()
  residual = (sums - mean * counts) / counts.mean()
  return {"raw": float(mean), "raw_se": float(residual.std(ddof=1) / np.sqrt(len(batches)))}


def _spread(batch_grads: list[np.ndarray]) -> float:
  """`E|g - E g|^2` over batches (unbiased): the batch gradient's noise."""
  g = np.array(batch_grads)
  return float(np.sum((g - g.mean(axis=0)) ** 2) / (len(g) - 1))


def exact(args) -> dict[str, float]:
  """`critic_ceiling.py --noise`'s exact per-turn `E[A^2]` for this game and policy."""
  env = GuessEnv(1, args.high, args.max_turns, 0.2, 0.1, info_gain_reward=args.info_gain)
  return CEILING.noise(env, CEILING.POLICIES[args.policy], args.lambdas, args.group)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--high", type=int, default=10)
  parser.add_argument("--max-turns", type=int, default=4)
  parser.add_argument("--info-gain", type=float, default=0.0)
  parser.add_argument("--policy", choices=("uniform", "consistent"), default="uniform")
  parser.add_argument("--batches", type=int, default=64)
  parser.add_argument("--continuations", type=int, default=32)
  parser.add_argument("--secrets", type=int, default=2)
  parser.add_argument("--group", type=int, default=4)
  parser.add_argument("--lambdas", type=float, nargs="+", default=[0.0, 0.5, 1.0])
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--critic-ev", type=float, nargs="*", default=[])
  args = parser.parse_args()
  for ev in args.critic_ev:
    if not 0.0 <= ev < 1.0:
      parser.error(f"--critic-ev {ev}: an explained variance in [0, 1)")
  least = {"batches": 2, "continuations": 0, "secrets": 1, "group": 2}
  for name, low in least.items():
    if getattr(args, name) < low:
      parser.error(f"--{name} {getattr(args, name)}: at least {low}")
  measured = run(args)
  reference = (
    exact(args)
    if CEILING.episode_count(args.policy, args.high, args.max_turns) <= CEILING.MAX_EPISODES
    else {}
  )
  check = {"grpo (raw)": f"grpo, {args.group}", "rloo": f"rloo, {args.group}"}
  check |= {f"exact critic, lambda {lam:g}": f"critic, lambda {lam:g}" for lam in args.lambdas}
  print(
    f"guess 1..{args.high}, {args.max_turns} turns, info gain {args.info_gain}, policy "
    f"{args.policy}, {args.batches} batches of {args.secrets} x {args.group}"
  )
  print(
    "| estimator | noise E[(A/c)^2] per turn | gradient SNR / GRPO's (as trained) | "
    "gradient error / GRPO's | bias share | EV | raw E[A^2] per turn ± SE | "
    "exact (critic_ceiling.py --noise) |"
  )
  print("| --- | --- | --- | --- | --- | --- | --- | --- |")
  for row, m in measured.items():
    ref = reference.get(check.get(row, ""), None)
    shown = [
      "-" if x is None or np.isnan(x) else f"{x:.{d}f}"
      for x, d in ((m["error_vs_grpo"], 2), (m["bias_share"], 2), (m.get("ev"), 3), (ref, 4))
    ]
    print(
      f"| {row} | {m['noise']:.4f} | {m['snr_vs_grpo']:.2f} | {shown[0]} | {shown[1]} | "
      f"{shown[2]} | {m['raw']:.4f} ± {m['raw_se']:.4f} | {shown[3]} |"
    )


if __name__ == "__main__":
  main()
