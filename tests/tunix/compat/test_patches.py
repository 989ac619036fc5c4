"""`compat.install` and `compat.prepare` apply the patch table (`compat.PATCHES`): importing
the package and building a learner on a cluster built by hand leave tunix and qwix as they
were (in a fresh process, against tunix and qwix as they load), the learner preparing only
its own cluster (its sampler); `prepare` changes that cluster's objects alone; `install`
changes qwix and tunix's registry, once (idempotent)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# also run on tunix main (.ci/run, lane 2)
pytestmark = [pytest.mark.fast, pytest.mark.tunix_facing]

SCRIPT = textwrap.dedent(
  """
  import warnings
  from qwix._src.providers import lora as qwix_lora
  from tunix.rl import function_registry

  def snapshot(sampler=None):
    registry = function_registry.default_registry
    names = {
      cat: {n: registry.get(cat, n) for n in registry.list_functions(cat)}
      for cat in registry.list_categories()
    }
    qwix = [qwix_lora._compute_lora_delta, qwix_lora.LoraProvider.einsum,
            qwix_lora.LoraProvider.dot_general]
    if sampler is None:
      return names, qwix
    return names, qwix, sampler.init_sample_state, sampler._transformer_graphdef

  fresh = snapshot()
  import tunix_ppo_ext
  from tunix_ppo_ext import config, data, envs, metrics, models, ops, plugins, rollout
  from tunix_ppo_ext import PpoExtConfig, PpoExtLearner, AgenticPpoConfig
  assert snapshot() == fresh, "importing the package changed tunix or qwix"

  from tests.helpers.learner import length_reward, make_cluster
  from tunix_ppo_ext._src.tunix import compat
  cluster, _, _ = make_cluster(reward_model=False, eval_temperature=None)
  sampler = compat.vanilla_sampler(cluster.rollout)
  before = snapshot(sampler)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the NaN guard's: a plain optimizer
    PpoExtLearner(rl_cluster=cluster, ppo_config=PpoExtConfig(), reward_fns=[length_reward])
    PpoExtLearner(rl_cluster=cluster, ppo_config=PpoExtConfig(policy_loss_fn="ppo"),
                  reward_fns=[length_reward])
  built = snapshot(sampler)
  assert built[:2] == before[:2], "building a learner changed tunix or qwix"
  assert built[2] is not before[2], "the learner left its cluster's sampler as tunix built it"

  assert cluster.actor_trainer._pbar is None, "a learner silenced tunix's progress bar"
  compat.prepare(cluster, quiet_trainers=True)
  assert snapshot(sampler) == built, "prepare() changed more than its cluster's trainers"
  assert isinstance(cluster.actor_trainer._pbar, compat.SilentProgressBar)

  tunix_ppo_ext.install(cluster)
  installed = snapshot(sampler)
  assert installed[1] != before[1], "install() left qwix"
  assert installed[2] is built[2], "install() adjusted the learner's sampler again"
  assert installed[0] == before[0], "install() alone registers nothing"
  tunix_ppo_ext.install(cluster)
  assert snapshot(sampler) == installed, "install() is not idempotent"
  tunix_ppo_ext.register_builtins()
  assert "ppo_ext" in function_registry.default_registry.list_functions("policy_loss_fn")
  print("ok")
  """
)


def test_import_and_learner_change_no_tunix_or_qwix_install_does():
  out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=False)
  assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
