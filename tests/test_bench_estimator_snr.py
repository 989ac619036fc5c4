"""`bench/estimator_snr.py`: every estimator on the same sampled batches of `guess` agrees
with `bench/critic_ceiling.py`'s exact enumeration within Monte Carlo error, and GRPO's
noise on one scale is RLOO's."""

from __future__ import annotations

import argparse

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
