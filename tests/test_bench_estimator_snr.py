"""`bench/estimator_snr.py`: every estimator on the same sampled batches of `guess` agrees
with `bench/critic_ceiling.py`'s exact enumeration within Monte Carlo error, and GRPO's
noise on one scale is RLOO's."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from tests.helpers.bench import load_bench

pytestmark = pytest.mark.tunix


def _run(**overrides):
  bench = load_bench("estimator_snr")
  options = dict(high=6, max_turns=3, info_gain=0.0, policy="uniform", batches=300)
  options |= dict(continuations=4, secrets=2, group=4, lambdas=[0.0, 1.0], seed=0, **overrides)
  args = argparse.Namespace(**options)
  return bench.run(args), bench.exact(args)


def test_sampled_rows_agree_with_the_enumeration():
  measured, exact = _run()
  pairs = {"grpo (raw)": "grpo, 4", "rloo": "rloo, 4", "exact critic, lambda 0": "critic, lambda 0"}
  pairs["exact critic, lambda 1"] = "critic, lambda 1"
  for row, column in pairs.items():
    got = measured[row]
    assert abs(got["raw"] - exact[column]) < 4 * got["raw_se"] + 1e-9, (row, got, exact[column])
  # on one scale GRPO (raw or std-divided) is RLOO, batch by batch
  assert measured["grpo (raw)"]["noise"] == pytest.approx(measured["rloo"]["noise"], rel=1e-6)
  assert measured["grpo (as trained)"]["noise"] == pytest.approx(
    measured["rloo"]["noise"], rel=1e-4
  )
  # a Monte Carlo critic of 4 continuations is noisier than the exact one
  assert measured["MC critic (4), lambda 0"]["noise"] > measured["exact critic, lambda 0"]["noise"]
  assert 0 < measured["signal E[A*^2]"]["noise"] < measured["exact critic, lambda 0"]["noise"]


def test_a_critic_with_errors_explains_the_variance_asked_and_leaves_the_batches_alone():
  """`--critic-ev`: the exact critic plus an error of the size that brings its explained
  variance down to the one asked (the exact critic explains about 0.22 here); the batches,
  and so every other row, stay those of a run without it; an error drawn anew at each
  visit biases no gradient; an explained variance above the exact critic's is refused."""
  without, _ = _run()
  measured, _ = _run(critic_ev=[0.1])
  for row, got in without.items():
    np.testing.assert_equal(measured[row], got, err_msg=row)  # NaN where none applies
  fresh = [f"critic EV 0.1, error fresh each visit, lambda {lam}" for lam in (0, 1)]
  fixed = [f"critic EV 0.1, error fixed per history, lambda {lam}" for lam in (0, 1)]
  for row in fresh + fixed:  # one draw of the fixed errors: its own variance, near sigma^2
    assert measured[row]["ev"] == pytest.approx(0.1, abs=0.03 if row in fresh else 0.06), row
    exact = measured[f"exact critic, lambda {row[-1]}"]
    assert measured[row]["noise"] > exact["noise"] and measured[row]["snr_vs_grpo"] > 1.0, row
  for row in fresh:  # unbiased: its error is its noise, relative to GRPO's as well
    got = measured[row]
    assert got["bias_share"] < 0.02, got
    assert got["error_vs_grpo"] == pytest.approx(1 / got["snr_vs_grpo"], rel=0.1), got
  with pytest.raises(SystemExit, match="--critic-ev 0.5: the exact critic explains 0.2"):
    _run(critic_ev=[0.5])
