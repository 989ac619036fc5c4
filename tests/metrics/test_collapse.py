"""The Echo Trap rule: a plain reference of the documented rule, the live watch, the spread."""

import json
import pathlib
import warnings

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.runs import SMOKE
from tunix_ppo_ext._src.metrics import collapse
from tunix_ppo_ext._src.metrics.keys import MetricKeys
from tunix_ppo_ext._src.metrics.sinks import KeyedBackend, read_jsonl
from tunix_ppo_ext._src.metrics.stats import return_spread
from tunix_ppo_ext._src.run import cli

pytestmark = pytest.mark.tunix

STD, ENT, GRAD = collapse.GROUP_STD_KEY, collapse.ENTROPY_KEY, collapse.GRAD_KEY
RET = collapse.RETURN_KEY
RECORDED = pathlib.Path(__file__).parent / "data" / "echo_trap_runs.json"


def reference_step(std, ent, grad, ret, max_return=None, early=10, window=10, fr=0.9):
  """The rule as the docs write it (default fractions 0.25, 0.5, 2), one value of each
  signal per batch `b` (step b + 1): medians of the first `early` and of the latest
  `window` values up to the batch."""
  for b in range(len(std)):
    n = b + 1
    if n < early + window:
      continue
    s0, s1 = np.median(std[:early]), np.median(std[n - window : n])
    h0, h1 = np.median(ent[:early]), np.median(ent[n - window : n])
    g0, g1 = np.median(grad[:early]), np.median(grad[n - window : n])
    r1 = np.median(ret[n - window : n])
    short = max_return is not None and r1 < fr * max_return
    if s1 <= 0.25 * s0 and h1 <= 0.5 * h0 and (g1 > 2 * g0 or short):
      return n
  return None


def rows_of(std, ent, grad, ret, std_key=STD):
  return [
    {"step": b + 1, std_key: s, ENT: h, GRAD: g, RET: r}
    for b, (s, h, g, r) in enumerate(zip(std, ent, grad, ret, strict=True))
  ]


def collapsing(n=60, at=30, noise=0.05, seed=0, grad_after=5.0, return_after=0.2):
  """Signals that hold until batch `at`, then the spread and entropy fall, the gradients
  go to `grad_after` (from 1) and the return to `return_after` (from 0.5)."""
  rng = np.random.default_rng(seed)
  after = np.arange(n) >= at
  std = np.where(after, 0.05, 1.0) + noise * rng.random(n)
  ent = np.where(after, 0.1, 1.0) + noise * rng.random(n)
  grad = np.where(after, grad_after, 1.0) + noise * rng.random(n)
  ret = np.where(after, return_after, 0.5) + noise * rng.random(n)
  return std, ent, grad, ret


def test_a_collapse_fires_once_where_the_reference_does_and_a_solved_run_never():
  signals = collapsing()  # RAGEN's: the gradients spike
  step = collapse.echo_trap_step(rows_of(*signals))
  assert step == reference_step(*signals) == 36  # the window's median turns at 6 of 10
  stuck = collapsing(grad_after=0.1)  # ours: the gradients vanish, the return is low
  assert collapse.echo_trap_step(rows_of(*stuck)) is None  # no maximum: only RAGEN's sign
  assert collapse.echo_trap_step(rows_of(*stuck), max_return=1.0) == 36
  assert reference_step(*stuck, max_return=1.0) == 36
  solved = collapsing(grad_after=0.1, return_after=0.95)  # converged at 0.95 of the maximum
  assert collapse.echo_trap_step(rows_of(*solved), max_return=1.0) is None
  assert reference_step(*solved, max_return=1.0) is None
  rows = rows_of(*signals, std_key=collapse.BATCH_STD_KEY)  # groups of one: the batch's
  assert collapse.echo_trap_step(rows) == 36


def test_recorded_runs_that_collapsed_fire_and_those_that_did_not_stay_quiet():
  """Real runs (`tests/metrics/data/echo_trap_runs.json` says which and how they ran): the
  embedded default, solved (1.22 of 1.25), and a noisy-stash seed still learning (1.42)
  never fire; a seed that settled on one invalid reply (0.0) and one that settled on always
  taking (entropy 0.002, 1.56 of 4.1) fire, at the steps the reference gives."""
  runs = json.loads(RECORDED.read_text())["runs"]
  steps = {}
  for name, run in runs.items():
    rows = run["rows"]
    steps[name] = collapse.echo_trap_step(rows, max_return=run["max_return"])
    batches = [r for r in rows if r.get(STD, r.get(collapse.BATCH_STD_KEY)) is not None]
    std = [r.get(STD, r.get(collapse.BATCH_STD_KEY)) for r in batches]
    by_step = {r["step"]: r for r in rows}
    ent, grad, ret = ([by_step[r["step"]][k] for r in batches] for k in (ENT, GRAD, RET))
    index = reference_step(std, ent, grad, ret, run["max_return"])
    assert steps[name] == (None if index is None else batches[index - 1]["step"]), name
  assert steps["memory_default"] is None and steps["stash_noisy_gae_seed0"] is None
  assert steps["stash_noisy_gae_seed2"] is not None
  assert steps["stash_noisy_grpo_seed0"] is not None


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
  st.integers(20, 50),
  st.integers(0, 2**31 - 1),
  st.sampled_from([(10, 10), (5, 3), (1, 1)]),
)
def test_the_rule_matches_the_reference_on_random_series(n, seed, sizes):
  rng = np.random.default_rng(seed)
  signals = [np.exp(rng.normal(0, 1.5, n)) for _ in range(4)]
  max_return = [None, 0.5, 3.0][seed % 3]
  early, window = sizes
  rule = collapse.EchoTrapRule(early=early, window=window)
  got = collapse.echo_trap_step(rows_of(*signals), rule, max_return)
  assert got == reference_step(*signals, max_return, early, window)


def test_missing_and_non_finite_values_are_skipped_and_nonsense_rules_refused():
  rows = rows_of(*collapsing())
  rows[3][GRAD] = None  # a null (non-finite) value in metrics.jsonl
  rows.insert(5, {"step": 5, "eval/episode_return/mean": 1.0})
  kept = [(r[STD], r[ENT], r[GRAD], r[RET]) for r in rows if r.get(GRAD) is not None]
  expected = reference_step(*map(np.asarray, zip(*kept, strict=True)))
  assert collapse.echo_trap_step(rows) == expected + 1  # one row fewer before it
  assert collapse.echo_trap_step([]) is None
  bad_rules = ({"early": 0}, {"window": 1.5}, {"std_frac": 0.0}, {"grad_spike": -1.0})
  for bad in (*bad_rules, {"return_frac": 1.5}):
    name = next(iter(bad))
    with pytest.raises(ValueError, match=f"{name}="):
      collapse.EchoTrapRule(**bad)


def test_the_watch_warns_once_and_logs_train_echo_trap_at_the_firing_step(monkeypatch):
  std, ent, grad, ret = collapsing()
  keys = MetricKeys(rename={"actor/entropy": "policy/entropy"}, updates_per_batch=2)
  watch = collapse.EchoTrapWatch(keys)
  seen: list[tuple[str, float, int]] = []

  class Recorder:  # a second sink, as tunix's logger would hold it
    def log_scalar(self, event, value, step=0):
      seen.append((event, value, step))

    def close(self):
      pass

  sinks = [KeyedBackend(watch, keys), KeyedBackend(Recorder(), keys)]

  def record(event, value, **kwargs):  # tunix's metrics path: every sink gets the event
    for sink in sinks:
      sink.log_scalar(event, value, **kwargs)

  # the sinks as tunix's logger registers them, without the process-wide listener list
  monkeypatch.setattr(jax.monitoring, "record_scalar", record)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for b in range(len(std)):  # the learner's batch b, then the trainer's two updates
      record("batch/train/in_group_return_std", std[b], step=b)
      record("batch/train/episode_return/mean", ret[b], step=b)
      for update in (2 * b + 1, 2 * b + 2):
        record("actor/train/entropy", ent[b], step=update)
        record("actor/train/grad_norm", grad[b], step=update)
  echo = [w for w in caught if issubclass(w.category, collapse.EchoTrapWarning)]
  assert len(echo) == 1 and f"echo trap at step {watch.fired_at}:" in str(echo[0].message)
  logged = [(step, value) for event, value, step in seen if event == "train/echo_trap"]
  assert logged == [(watch.fired_at, 1.0)]
  rows: dict[int, dict] = {}  # what metrics.jsonl holds: the recorded events, merged per step
  for event, value, step in seen:
    rows.setdefault(step, {"step": step})[event.replace("policy/", "actor/")] = value
  assert watch.fired_at == collapse.echo_trap_step(rows.values())  # live == afterwards
  assert (watch.fired_at - 1) % 2 == 0  # a learner batch's step, 2 updates per batch


def test_a_closed_watch_and_one_whose_steps_go_back_ignore_later_events():
  """JAX keeps every scalar listener registered, so a finished (or failed) run's watch
  still receives the next run's events in the same process: once closed, or once a step
  goes back (the next run's start), it ignores them."""
  std, ent, grad, ret = collapsing()
  watch = collapse.EchoTrapWatch()
  watch.close()
  with warnings.catch_warnings():
    warnings.simplefilter("error", collapse.EchoTrapWarning)
    for b in range(len(std)):
      watch.log_scalar(STD, std[b], step=b + 1)
      watch.log_scalar(RET, ret[b], step=b + 1)
      watch.log_scalar(ENT, ent[b], step=b + 1)
      watch.log_scalar(GRAD, grad[b], step=b + 1)
  assert watch.fired_at is None
  failed = collapse.EchoTrapWatch()  # a run that failed at step 5, never closed
  for key in (STD, RET, ENT, GRAD):
    failed.log_scalar(key, 1.0, step=5)
  with warnings.catch_warnings():
    warnings.simplefilter("error", collapse.EchoTrapWarning)
    for b in range(len(std)):
      for key, series in ((STD, std), (RET, ret), (ENT, ent), (GRAD, grad)):
        failed.log_scalar(key, series[b], step=b + 1)
  assert failed.fired_at is None
  live = collapse.EchoTrapWatch()  # the same events reach an open watch, which fires
  with warnings.catch_warnings(record=True):
    warnings.simplefilter("always")
    for b in range(len(std)):
      for key, series in ((STD, std), (RET, ret), (ENT, ent), (GRAD, grad)):
        live.log_scalar(key, series[b], step=b + 1)
  assert live.fired_at == collapse.echo_trap_step(rows_of(std, ent, grad, ret))


def test_a_training_run_warns_and_logs_train_echo_trap_where_its_rows_say(tmp_path):
  """The smoke config through the CLI with a rule that holds on any run (spread and entropy
  at most 1e9 times their first values, any gradient): the run warns once and
  `metrics.jsonl` holds `train/echo_trap` at the step the rule gives on its own rows."""
  rule = "{early: 1, window: 1, std_frac: 1.0e9, entropy_frac: 1.0e9, grad_spike: 0.0}"
  out = tmp_path / "run"
  args = ["train", "--config", str(SMOKE), "--output-dir", str(out), "wandb=disabled"]
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always", collapse.EchoTrapWarning)
    assert cli.main([*args, f"metrics.echo_trap={rule}"]) == 0
  rows = read_jsonl(out / "metrics.jsonl")
  logged = [row["step"] for row in rows if "train/echo_trap" in row]
  step = collapse.echo_trap_step(rows, collapse.EchoTrapRule(1, 1, 1.0e9, 1.0e9, 0.0))
  assert logged == [step]
  echo = [str(w.message) for w in caught if issubclass(w.category, collapse.EchoTrapWarning)]
  assert [m for m in echo if m.startswith(f"echo trap at step {step}: return spread")]
  assert collapse.echo_trap_step(rows) is None  # the default rule: no collapse in 4 steps


def test_return_spread_matches_numpy_on_awkward_groups():
  returns = np.array([1.0, 3.0, 2.0, 2.0, 5.0])
  groups = np.array([0, 0, 1, 1, 2])  # group 2 has one row: left out of the in-group mean
  spread = return_spread(returns, groups)
  assert spread["batch/episode_return_std"] == pytest.approx(np.std(returns))
  assert spread["batch/in_group_return_std"] == pytest.approx(np.mean([1.0, 0.0]))
  assert "batch/in_group_return_std" not in return_spread(returns, np.arange(5))
  assert return_spread(np.array([]), None) == {}
  assert "batch/in_group_return_std" not in return_spread(returns, None)
