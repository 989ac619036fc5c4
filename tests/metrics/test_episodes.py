"""What a run shows of its episodes: success rate, `info` means, sampled conversations.

Unit tests compare `episode_metrics` with a plain-Python reference written from the rule
(last reported value per episode, mean over the episodes that reported it); one CLI run
of configs/frozenlake.yaml at smoke size with W&B offline reads `train/success_rate`,
`eval/success_rate`, `train/env/...`, `samples.jsonl` and the W&B table back.
"""

from __future__ import annotations

import json
import math
import pathlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers.wandb_files import read_wandb_run
from tunix_ppo_ext._src.metrics import episodes
from tunix_ppo_ext._src.metrics.keys import MetricKeys
from tunix_ppo_ext._src.metrics.samples import SampleWriter, read_samples, table_rows
from tunix_ppo_ext._src.metrics.sinks import read_jsonl
from tunix_ppo_ext._src.run import cli

pytestmark = pytest.mark.tunix


def reference(batch):
  """The documented rule, written plainly: per episode the last finite number per key."""
  finals = []
  for infos in batch:
    final = {}
    for info in infos:
      for key, value in info.items():
        if isinstance(value, bool | np.bool_):
          final[key] = float(value)
        elif isinstance(value, int | float | np.integer | np.floating) and math.isfinite(value):
          final[key] = float(value)
    finals.append(final)
  out = {}
  if any("success" in f for f in finals):
    out["batch/success_rate"] = np.mean([f.get("success", 0.0) > 0 for f in finals])
  for key in {k for f in finals for k in f} - {"success"}:
    out[f"env/{key}"] = np.mean([f[key] for f in finals if key in f])
  return out


def test_success_and_info_means_on_hand_written_episodes():
  batch = [
    [{"success": False, "attempt": 1, "outcome": "too_high"}, {"success": True, "attempt": 2}],
    [{"success": False, "attempt": 1}, {"attempt": 2, "dist": float("nan")}],  # nan skipped
    [{"attempt": np.int64(1), "dist": 3.0}],  # never reported success: a failure
    [],  # no step at all (cut before its first turn ended)
  ]
  got = episodes.episode_metrics(batch)
  assert got == pytest.approx({"batch/success_rate": 0.25, "env/attempt": 5 / 3, "env/dist": 3.0})
  assert got == pytest.approx(reference(batch))
  # samples.jsonl's `success`: as the rate counts it (never reported: a failure)
  assert episodes.episode_successes(batch) == [True, False, False, False]
  assert episodes.episode_successes(batch[2:]) == [None, None]  # none reported: unknown


def test_nothing_reported_gives_no_metric():
  assert episodes.episode_metrics([[{"text": "x"}], [{}]]) == {}


_values = st.one_of(
  st.booleans(),
  st.integers(-5, 5),
  st.floats(allow_nan=True, allow_infinity=True, width=32),
  st.text(max_size=2),
)
_info = st.dictionaries(st.sampled_from(["success", "a", "b"]), _values, max_size=3)


@given(st.lists(st.lists(_info, max_size=4), min_size=1, max_size=6))
def test_metrics_match_the_reference_and_are_finite(batch):
  got = episodes.episode_metrics(batch)
  want = reference(batch)
  assert got.keys() == want.keys()
  for key, value in got.items():
    assert math.isfinite(value) and value == pytest.approx(want[key], rel=1e-12, abs=1e-300)


@given(
  st.lists(
    st.tuples(st.sampled_from(["memory", "sokoban", "gym:A/B"]), st.floats(-3, 3), _info),
    min_size=1,
    max_size=8,
  )
)
def test_per_environment_metrics_match_the_reference_per_tag(rows):
  tags = [tag for tag, _, _ in rows]
  returns = [ret for _, ret, _ in rows]
  batch = [[info] for _, _, info in rows]
  got = episodes.env_metrics(tags, returns, batch)
  want = {}
  for tag in set(tags):
    mine = [i for i, t in enumerate(tags) if t == tag]
    want[f"env/{tag}/episode_return"] = np.mean([returns[i] for i in mine])
    for key, value in reference([batch[i] for i in mine]).items():
      want[f"env/{tag}/{key.split('/', 1)[1]}"] = value
  assert got.keys() == want.keys()
  for key, value in got.items():
    assert value == pytest.approx(want[key], rel=1e-12, abs=1e-12)
  with pytest.raises(ValueError, match="2 tags, 1 returns"):
    episodes.env_metrics(["a", "b"], [1.0], [[], []])


def test_conversation_roles_are_checked():
  turns = [("observation", "see b!"), ("agent", "k")]
  assert episodes.conversation(turns) == [
    {"role": "observation", "text": "see b!"},
    {"role": "agent", "text": "k"},
  ]
  with pytest.raises(ValueError, match="role must be 'observation' or 'agent', got 'user'"):
    episodes.conversation([("user", "hi")])


@pytest.mark.parametrize(
  "event, step, key, published_step",
  [
    ("batch/train/success_rate", 0, "train/success_rate", 1),
    ("batch/eval/success_rate", 2, "eval/success_rate", 2),
    ("env/train/attempt", 0, "train/env/attempt", 1),
    ("env/eval/attempt", 2, "eval/env/attempt", 2),
    ("env/train/game/moves", 3, "train/env/game/moves", 4),
    ("env/train/sokoban/episode_return", 0, "train/env/sokoban/episode_return", 1),
  ],
)
def test_episode_keys_in_the_taxonomy(event, step, key, published_step):
  keys = MetricKeys()
  assert keys.key(event) == key and keys.step(event, step) == published_step


def test_env_keys_can_be_renamed_and_dropped():
  keys = MetricKeys(rename={"train/env/attempt": "game/attempts"}, drop=["eval/env/*"])
  assert keys.key("env/train/attempt") == "game/attempts"
  assert keys.key("env/eval/attempt") is None
  assert keys.key("batch/eval/success_rate") == "eval/success_rate"


def test_sample_writer_appends_jsonl_without_wandb(tmp_path):
  writer = SampleWriter(tmp_path / "samples.jsonl")
  sample = {"row": 0, "seed": 3, "return": 1.0, "success": True, "turns": []}
  writer(0, [sample])
  writer(2, [sample | {"row": 4}])
  rows = read_samples(tmp_path / "samples.jsonl")
  assert [(r["step"], r["row"], r["mode"]) for r in rows] == [(0, 0, "eval"), (2, 4, "eval")]
  turns = [{"role": "observation", "text": "a"}, {"role": "agent", "text": "b"}]
  assert table_rows(5, [sample | {"turns": turns}]) == [
    [5, 0, 0, "observation", "a", 1.0, True],
    [5, 0, 1, "agent", "b", 1.0, True],
  ]


def test_samples_are_written_at_the_step_of_the_metrics(tmp_path):
  """With 4 updates a batch, an evaluation after 1 batch is at step 4 in metrics.jsonl
  (`MetricKeys.step`) and in samples.jsonl alike."""
  writer = SampleWriter(tmp_path / "samples.jsonl", updates_per_batch=4)
  writer(1, [{"row": 0, "seed": 3, "return": 1.0, "success": True, "turns": []}])
  (row,) = read_samples(tmp_path / "samples.jsonl")
  assert row["step"] == MetricKeys(updates_per_batch=4).step("batch/eval/success_rate", 1) == 4


# ----- one run of the main job -----

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
EVAL_STEPS = [0, 2]  # smoke: 4 steps, eval_every 2 (tunix evaluates before steps 1 and 3)


@pytest.fixture(scope="module")
def frozenlake_run(tmp_path_factory):
  """configs/frozenlake.yaml at smoke size (4 steps, evaluations after 0 and 2 updates),
  W&B offline, 3 samples per evaluation."""
  out = tmp_path_factory.mktemp("episodes") / "run"
  args = ["train", "--config", str(CONFIGS / "frozenlake.yaml"), "--output-dir", str(out)]
  args += ["train.steps=4", "train.batch_size=8", "train.eval_every=2", "wandb=offline"]
  args += ["train.checkpoint_every=2", "model.num_layers=1", "model.embed_dim=32"]
  args += ["model.hidden_dim=64", "env.max_turns=3", "env.max_completion_len=40"]
  assert cli.main([*args, "train.eval_samples=3"]) == 0
  return out


def test_success_rate_and_info_means_reach_metrics_jsonl(frozenlake_run):
  rows = read_jsonl(frozenlake_run / "metrics.jsonl")
  train = [r for r in rows if "train/episode_return/mean" in r]
  assert len(train) == 4
  for row in train:
    # frozenlake: success = reached the goal, the only reward (1.0)
    assert row["train/success_rate"] == pytest.approx(row["train/episode_return/mean"])
    assert 0 <= row["train/env/invalid_action"] <= 1
  evals = [r for r in rows if "eval/success_rate" in r]
  assert [r["step"] for r in evals] == EVAL_STEPS
  assert all(0 <= r["eval/env/invalid_action"] <= 1 for r in evals)
  assert cli.main(["plot", str(frozenlake_run)]) == 0  # with its success-rate panel


def test_samples_are_written_per_evaluation_with_marked_turns(frozenlake_run):
  samples = read_samples(frozenlake_run / "samples.jsonl")
  assert [s["step"] for s in samples] == [s for s in EVAL_STEPS for _ in range(3)]
  for sample in samples:
    turns = sample["turns"]
    roles = [t["role"] for t in turns]
    assert roles[0] == "observation" and turns[0]["text"] == "pfff fhfh fffh hffg"
    assert all(a != b for a, b in zip(roles, roles[1:], strict=False))  # they alternate
    assert 2 <= len(turns) <= 6  # 3 agent turns at most; the last board may be cut
    assert isinstance(sample["success"], bool) and sample["return"] == float(sample["success"])
  # one sample per group of 4 (the batch of 8 is two groups), then the rest
  assert [s["row"] for s in samples[:3]] == [0, 4, 1]


def test_samples_reach_wandb_as_a_table(frozenlake_run):
  (run_file,) = (frozenlake_run / "wandb").glob("offline-run-*/run-*.wandb")
  history, _ = read_wandb_run(run_file)
  # W&B stores a table as a file, its history row as flattened `eval/samples/<field>` keys
  tables = [row for row in history if "eval/samples/path" in row]
  assert [row["global_step"] for row in tables] == EVAL_STEPS
  assert all(row["eval/samples/_type"] == "table-file" for row in tables)
  files = run_file.parent / "files"
  table = json.loads((files / tables[-1]["eval/samples/path"]).read_text())
  assert table["columns"] == ["step", "row", "turn", "role", "text", "return", "success"]
  expected = [s for s in read_samples(frozenlake_run / "samples.jsonl") if s["step"] == 2]
  assert table["data"] == table_rows(2, expected)
  assert any(row.get("train/success_rate") is not None for row in history)


def test_with_two_updates_a_batch_samples_and_metrics_share_the_evaluation_steps(tmp_path):
  out = tmp_path / "run"
  args = ["train", "--config", str(CONFIGS / "smoke.yaml"), "--output-dir", str(out)]
  args += ["train.steps=4", "train.eval_every=2", "ppo.num_iterations=2"]
  assert cli.main(args) == 0
  evals = [r["step"] for r in read_jsonl(out / "metrics.jsonl") if "eval/return/mean" in r]
  samples = sorted({s["step"] for s in read_samples(out / "samples.jsonl")})
  assert evals == samples and len(samples) >= 2 and samples[1] > 1, (evals, samples)
