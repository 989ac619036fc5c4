"""The critic recipe's keys (#42) through `tunix-ppo-ext train`, end to end on the smoke
config: value pretraining with its early end, decoupled and length-adaptive lambdas, the
turn discount, turn-level GAE and a value head that starts at zero."""

from __future__ import annotations

import math
import pathlib

import pytest

from tunix_ppo_ext._src.run import cli
from tunix_ppo_ext.metrics import read_jsonl

pytestmark = pytest.mark.tunix

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
RECIPE = [
  "ppo.advantage_estimator=turn_gae",
  "ppo.critic_warmup_steps=2",
  "ppo.critic_warmup_lambda=1.0",
  "ppo.critic_warmup_patience=5",
  "ppo.critic_lambda=1.0",
  "ppo.gae_lambda=0.9",
  "ppo.adaptive_lambda_alpha=0.5",
  "ppo.gamma_turn=0.95",
  "model.value_head_init=zero",
]


def test_the_recipe_trains_and_logs_its_warmup(tmp_path):
  out = tmp_path / "run"
  args = ["train", "--config", str(CONFIGS / "smoke.yaml"), "--output-dir", str(out)]
  assert cli.main([*args, "train.steps=3", *RECIPE]) == 0
  rows = read_jsonl(out / "metrics.jsonl")
  warm = {r["step"]: r["critic/warmup"] for r in rows if "critic/warmup" in r}
  assert warm == {1: 1.0, 2: 1.0, 3: 0.0}
  done = [r["critic/warmup_steps"] for r in rows if "critic/warmup_steps" in r]
  assert done == [1.0, 2.0, 2.0]
  losses = [r["critic/vf_loss"] for r in rows if "critic/vf_loss" in r]
  assert len(losses) == 3 and all(math.isfinite(v) for v in losses)
  assert cli.main(["plot", str(out)]) == 0


@pytest.mark.parametrize(
  "override, key",
  [
    ("ppo.critic_lambda=1.5", "critic_lambda"),
    ("ppo.gamma_turn=-1", "gamma_turn"),
    ("ppo.adaptive_lambda_alpha=0", "adaptive_lambda_alpha"),
    ("ppo.critic_warmup_until_ev=0.5", "critic_warmup_until_ev"),
    ("ppo.critic_warmup_patience=2", "critic_warmup_patience"),
    ("model.value_head_init=ones", "model.value_head_init"),
  ],
)
def test_bad_recipe_values_are_one_line_naming_the_key(override, key, capsys):
  args = ["train", "--config", str(CONFIGS / "smoke.yaml"), "--output-dir", "unused"]
  assert cli.main([*args, override]) == 2
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1 and key in lines[0], lines
