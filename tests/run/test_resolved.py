"""Configuration resolved once: the embedded default file, `PpoExtConfig`'s defaults for
what a config leaves out, one `ResolvedRun` per command, and the CLI's exit codes."""

from __future__ import annotations

import dataclasses
import inspect
import pathlib

import pytest

from tests.helpers.runs import train_in_process
from tunix_ppo_ext._src.checks import ConfigError
from tunix_ppo_ext._src.config import loader
from tunix_ppo_ext._src.plugins import registry
from tunix_ppo_ext._src.run import cli, job, run_config, sweep
from tunix_ppo_ext._src.run.run_config import RunConfig, load_resolved, load_run_config
from tunix_ppo_ext._src.tunix.cluster.mesh import role_meshes
from tunix_ppo_ext._src.tunix.learner.ppo_config import PpoExtConfig
from tunix_ppo_ext.models import build_cluster

pytestmark = pytest.mark.tunix

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
SMOKE = str(CONFIGS / "smoke.yaml")


def test_configs_default_yaml_is_the_embedded_default():
  # one copy: configs/default.yaml is a link to the file the package ships
  assert (CONFIGS / "default.yaml").resolve() == loader.EMBEDDED_DEFAULT.resolve()
  assert load_run_config(str(CONFIGS / "default.yaml")) == load_run_config(None)


def test_the_embedded_default_differs_from_the_dataclass_defaults_only_in_its_ppo_tuning():
  embedded = load_run_config(None)
  assert dataclasses.replace(embedded, ppo=RunConfig().ppo) == RunConfig()
  assert embedded.ppo["entropy_coef"] == 0.03 and embedded.ppo["kl_ctrl"] == "adaptive"


def test_a_config_naming_one_ppo_key_inherits_ppo_ext_configs_defaults(tmp_path):
  path = tmp_path / "mine.yaml"
  path.write_text("ppo:\n  advantage_estimator: gae\n")
  resolved = load_resolved(str(path))
  defaults = PpoExtConfig(advantage_estimator="gae", logps_temperature=1.0)
  assert resolved.ppo == defaults
  # none of the embedded toy's tuning: tunix's and verl's conventions
  assert resolved.ppo.kl_ctrl == "fixed" and resolved.ppo.whiten_advantages
  assert resolved.ppo.entropy_coef == 0.0 and resolved.ppo.num_iterations == 1


def test_grl_recipe_keeps_a_constant_kl_coefficient():
  resolved = load_resolved(str(CONFIGS / "grl_ppo_recipe.yaml"), need_files=False)
  assert resolved.ppo.kl_ctrl == "fixed" and resolved.ppo.beta == 0.001


def test_resolved_run_holds_what_consumers_derived_again():
  resolved = load_resolved(SMOKE, ["ppo.advantage_estimator=grpo", "ppo.num_generations=4"])
  assert resolved.num_generations == 4 and resolved.prompts_per_batch == 2
  assert resolved.checkpoint_roles == ("actor",)  # a group estimator builds no critic
  assert resolved.batch.rollout_chunk == resolved.run.train.batch_size == 8
  assert [e.groups for e in resolved.env_entries] == [2]
  with pytest.raises(dataclasses.FrozenInstanceError):
    resolved.batch = None  # type: ignore[misc]


def test_train_resolves_the_config_and_builds_the_meshes_exactly_once(tmp_path, monkeypatch):
  built = {"resolved": 0, "ppo": 0}
  resolved_init = run_config.ResolvedRun.__init__
  ppo_post_init = PpoExtConfig.__post_init__

  def count_resolved(self, *args, **kwargs):
    built["resolved"] += 1
    resolved_init(self, *args, **kwargs)

  def count_ppo(self, keys=None):
    built["ppo"] += 1
    ppo_post_init(self, keys)

  def count_meshes(section):
    built["meshes"] = built.get("meshes", 0) + 1
    return role_meshes(section)

  monkeypatch.setattr(run_config.ResolvedRun, "__init__", count_resolved)
  monkeypatch.setattr(PpoExtConfig, "__post_init__", count_ppo)
  monkeypatch.setattr(job, "role_meshes", count_meshes)
  out = tmp_path / "run"
  assert cli.main(["train", "--config", SMOKE, "--output-dir", str(out), "train.steps=2"]) == 0
  assert built == {"resolved": 1, "ppo": 1, "meshes": 1}


def test_build_cluster_takes_the_resolved_runs_cluster_spec(tmp_path, monkeypatch):
  # its signature: the objects a cluster holds, and one ClusterSpec for every plain setting
  settings = [
    p for p in inspect.signature(build_cluster).parameters.values() if p.kind == p.KEYWORD_ONLY
  ]
  assert list(inspect.signature(build_cluster).parameters)[3] == "spec"
  assert {p.name for p in settings} == {
    "reference",
    "mesh",
    "role_meshes",
    "optimizers",
    "checkpoint_dir",
    "metrics_dir",
    "metric_backends",
    "metric_keys",
  }
  grpo = ["ppo.advantage_estimator=grpo", "ppo.num_generations=2"]
  overrides = [*grpo, "train.steps=2", "batch.mini_batch_size=4", "sampling.eval_temperature=0.5"]
  resolved = load_resolved(SMOKE, overrides)
  spec = resolved.cluster
  assert (spec.max_steps, spec.batch, spec.mini_batch_size) == (2, 4, 2)  # in prompts
  assert spec.train_micro_batch_size is None and spec.eval_sampling == {"temperature": 0.5}
  given = []
  real = job.build_cluster
  monkeypatch.setattr(job, "build_cluster", lambda *a, **k: given.append(a[3]) or real(*a, **k))
  job.build_run(resolved, tmp_path)
  assert given == [spec]


def _count_resolutions(monkeypatch) -> dict[str, int]:
  count = {"resolved": 0}
  resolved_init = run_config.ResolvedRun.__init__

  def counting(self, *args, **kwargs):
    count["resolved"] += 1
    resolved_init(self, *args, **kwargs)

  monkeypatch.setattr(run_config.ResolvedRun, "__init__", counting)
  return count


def test_plan_and_export_resolve_the_config_exactly_once(tmp_path, monkeypatch):
  run = tmp_path / "run"
  steps = ["train.steps=2", "train.batch_size=4", "train.eval_batches=0"]
  train_in_process(SMOKE, run, *steps, "train.checkpoint_every=2")
  count = _count_resolutions(monkeypatch)
  plan = ["plan", "--config", SMOKE, "--compiler", "cpu", "--topology", "v5e:1x1"]
  assert cli.main([*plan, "--pieces", "actor/logps_pass"]) == 0
  assert count == {"resolved": 1}
  assert cli.main(["export", str(run), str(tmp_path / "hf")]) == 0
  assert count == {"resolved": 2}


def test_sweep_resolves_each_seed_it_starts_exactly_once(tmp_path, monkeypatch):
  # the sweep process validates every seed's config before starting any; each seed's
  # `train` subprocess then resolves its own once (the train test above counts that)
  started = []
  monkeypatch.setattr(sweep.Seeds, "run", lambda self, d, overrides, seed: started.append(d))
  count = _count_resolutions(monkeypatch)
  sweep.sweep(2, tmp_path, ["train.lr=0.1,0.2", "train.steps=2"], SMOKE)
  assert len(started) == 4 and count == {"resolved": 4}


def test_bad_input_is_a_config_error_and_exits_2(tmp_path, capsys):
  with pytest.raises(ConfigError, match=r"^config key 'ppo.entropy_coef'=-1 is invalid"):
    load_resolved(SMOKE, ["ppo.entropy_coef=-1"])
  with pytest.raises(ConfigError, match="train.batch_size"):
    load_resolved(SMOKE, ["ppo.num_generations=3"])
  code = cli.main(["train", "--config", SMOKE, "--output-dir", str(tmp_path), "ppo.gamma=2"])
  assert code == cli.EXIT_BAD_INPUT
  assert "config key 'ppo.gamma'=2 is invalid" in capsys.readouterr().err


class _BrokenAtRunTime:
  """An environment that passes every check and fails on its first step."""

  name, max_return = "broken_at_run_time", 1.0

  def reset(self, seed=None):
    del seed
    return "see a!", {}

  def step(self, action):
    raise ValueError(f"this environment fails at run time ({action!r})")


def test_a_failure_at_run_time_exits_1_naming_it(tmp_path, capsys):
  registry.register(registry.ENVIRONMENTS, "broken_at_run_time")(_BrokenAtRunTime)
  try:
    argv = ["train", "--config", SMOKE, "--output-dir", str(tmp_path / "run")]
    code = cli.main([*argv, "env.name=broken_at_run_time"])
  finally:
    registry.unregister(registry.ENVIRONMENTS, "broken_at_run_time")
  assert code == cli.EXIT_FAILED
  err = capsys.readouterr().err.strip().splitlines()[-1]
  assert err.startswith("tunix-ppo-ext: error: RuntimeError: environment 'broken_at_run_time'")
  assert "raised ValueError: this environment fails at run time" in err
