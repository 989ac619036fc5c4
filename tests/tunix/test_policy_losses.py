"""verl's other policy losses and rollout correction through the CLI: a short real run each.

One parametrized test: the smoke config (tunix's learner, cluster and toy Qwen3), one
update, every loss under its registered name; the metrics are finite, and with rollout
correction on (a sampling temperature of 0.7 against log-probs at 1.0: a real
sampler-trainer gap) its `rollout/` metrics are there and in range. A persistent JAX
compilation cache shared by the cases keeps the identical rollout programs compiled once.
"""

import json
import math

import jax
import pytest

from tests.conftest import SMOKE
from tunix_ppo_ext.app import cli
from tunix_ppo_ext.metrics import keys as metric_keys
from tunix_ppo_ext.tunix.policy_losses import NAMES

CORRECTION = ["ppo.rollout_is=token", "ppo.rollout_rs=token_k1", "ppo.rollout_rs_threshold=1.5"]
CASES = [[f"ppo.policy_loss_fn={name}"] for name in NAMES]
CASES[0] = CASES[0] + CORRECTION  # gspo with token-level TIS and IcePop-style rejection
CASES.append(["ppo.rollout_is=sequence", "ppo.rollout_rs=seq_mean_k1"])  # ppo_ext


@pytest.fixture(scope="module")
def compilation_cache(tmp_path_factory):
  before = jax.config.jax_compilation_cache_dir
  jax.config.update("jax_compilation_cache_dir", str(tmp_path_factory.mktemp("jax_cache")))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  yield
  jax.config.update("jax_compilation_cache_dir", before)


@pytest.mark.parametrize("overrides", CASES, ids=lambda o: "+".join(v.split("=")[1] for v in o))
def test_cli_trains_each_loss_with_finite_metrics(overrides, tmp_path, compilation_cache):
  out = tmp_path / "run"
  args = ["train", "--config", str(SMOKE), "--output-dir", str(out), "train.steps=1"]
  args += ["train.batch_size=4", "train.eval_batches=0", "train.temperature=0.7"]
  args += ["ppo.logps_temperature=1.0", *overrides]
  assert cli.main(args) == 0
  rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
  values = {k: v for row in rows for k, v in row.items() if k != "step"}
  assert all(math.isfinite(v) for v in values.values()), values
  assert {"actor/pg_loss", "actor/ppo_kl", "actor/entropy", "actor/grad_norm"} <= set(values)
  correction = {k for k in values if k in metric_keys.CONDITIONAL_KEYS}
  if not any("rollout_is" in o for o in overrides):
    assert not correction
    return
  assert correction == metric_keys.CONDITIONAL_KEYS
  assert values["rollout/logprob_diff"] > 0  # the temperature gap is real
  assert 0 < values["rollout/is_ess"] <= 1 and values["rollout/is_max"] > 0
  assert (
    0 <= values["rollout/rs_masked_frac"] <= 1 and 0 <= values["rollout/rs_seq_masked_frac"] <= 1
  )
