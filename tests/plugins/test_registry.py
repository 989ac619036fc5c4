"""The plugin registry: built-ins in code, entry points, real installed plugins, errors, `plugins`.

The plugin distributions (`examples/`, `tests/plugins/`) are really built and installed
with pip (`--target` into a per-session temporary directory, offline, no build isolation)
and put on `sys.path` only for the test that uses them: the shared environment is never
changed, so other tests (and the other xdist worker) never see them.
"""

import json
import math
import pathlib
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tunix.rl import function_registry

import tunix_ppo_ext
from tunix_ppo_ext import PpoExtConfig, envs
from tunix_ppo_ext._src.metrics.sinks import read_jsonl
from tunix_ppo_ext._src.ops import kl
from tunix_ppo_ext._src.ops import kl_methods as names
from tunix_ppo_ext._src.ops.advantages import compute_gae_advantages
from tunix_ppo_ext._src.plugins import builtins, protocols, registry
from tunix_ppo_ext._src.run import cli
from tunix_ppo_ext._src.run.run_config import load_resolved, load_run_config
from tunix_ppo_ext._src.tunix.learner.loss_fns import ppo_ext_policy_loss_fn, register_configured
from tunix_ppo_ext._src.tunix.learner.ppo_config import estimator_takes_values

pytestmark = pytest.mark.tunix

REPO = pathlib.Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
PLUGINS = {  # name -> (source directory, its top-level modules)
  "example": (REPO / "examples" / "ppo_ext_example_plugin", "ppo_ext_example_plugin"),
  "minimal": (REPO / "examples" / "my-kl", "my_kl"),
  "broken": (REPO / "tests" / "plugins" / "broken_plugin", "ppo_ext_broken_plugin"),
  "clashing": (REPO / "tests" / "plugins" / "clashing_plugin", "ppo_ext_clashing_plugin"),
}
KL, ADV, ENV, SINK = (
  registry.KL_ESTIMATORS,
  registry.ADVANTAGE_ESTIMATORS,
  registry.ENVIRONMENTS,
  registry.METRIC_SINKS,
)


@pytest.fixture(scope="session")
def install_plugin(tmp_path_factory):
  """`install(name) -> site directory`: pip-installs the plugin once per session (worker)."""
  installed: dict[str, pathlib.Path] = {}

  def install(name: str) -> pathlib.Path:
    if name not in installed:
      source, _ = PLUGINS[name]
      copy = tmp_path_factory.mktemp(f"src-{name}") / source.name  # builds write in-tree
      shutil.copytree(source, copy, ignore=shutil.ignore_patterns("build", "*.egg-info"))
      site = tmp_path_factory.mktemp(f"site-{name}")
      command = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation"]
      command += ["--no-index", "--quiet", "--target", str(site), str(copy)]
      done = subprocess.run(command, capture_output=True, text=True, check=False)
      assert done.returncode == 0, done.stdout + done.stderr
      installed[name] = site
    return installed[name]

  return install


@pytest.fixture
def use_plugins(install_plugin, monkeypatch):
  """`use(*names)`: the plugins' site directories on `sys.path` for this test only."""
  used: list[str] = []

  def use(*names: str) -> None:
    for name in names:
      monkeypatch.syspath_prepend(str(install_plugin(name)))
      used.append(PLUGINS[name][1])
    registry.clear_cache()

  yield use
  monkeypatch.undo()
  for module in [m for m in sys.modules if m.split(".")[0] in used]:
    del sys.modules[module]
  registry.clear_cache()


def _plugin_modules(top: str) -> set[str]:
  return {m for m in sys.modules if m.split(".")[0] == top}


# ----- built-ins -----


def test_builtins_are_registered_in_code_for_this_distribution():
  expected = {
    KL: {"kl", "abs", "mse_kl", "low_var_kl"},
    ADV: {"gae", "grpo", "rloo", "reinforce_plus_plus"},
    registry.POLICY_LOSSES: {"ppo_ext"},
    registry.VALUE_LOSSES: {"ppo_ext"},
    ENV: {"memory"},
    SINK: {"jsonl"},
  }
  for kind, wanted in expected.items():
    own = [e for e in registry.entries(kind) if e.distribution == "tunix-ppo-ext"]
    assert wanted <= {e.name for e in own}, kind
    assert all(e.builtin and e.entry_point is None for e in own), kind
    assert {e.name for e in own} == set(builtins.BUILTINS[kind]), kind
    installed = [e for e in registry.entries(kind) if e.entry_point is not None]
    assert all(e.entry_point.group == f"tunix_ppo_ext.{kind}" for e in installed)
  assert registry.get(KL, "low_var_kl") is kl.kl_k3 is registry.RegistryView(KL)["low_var_kl"]
  assert registry.RegistryView(registry.ADVANTAGE_ESTIMATORS)["gae"] is compute_gae_advantages
  assert registry.get(registry.POLICY_LOSSES, "ppo_ext") is ppo_ext_policy_loss_fn
  assert registry.RegistryView(registry.ENVIRONMENTS)["memory"] is envs.MemoryEnv
  assert "nope" not in registry.RegistryView(KL) and len(registry.RegistryView(KL)) == len(
    registry.names(KL)
  )


def test_builtins_need_no_installed_metadata(monkeypatch):
  """No entry point installed at all (a source tree never `pip install`ed): every built-in
  is there, from this distribution, and loads."""
  monkeypatch.setattr(registry.importlib.metadata, "entry_points", lambda **_: ())
  registry.clear_cache()
  try:
    for kind in registry.KINDS:
      assert registry.names(kind) == sorted(builtins.BUILTINS[kind]), kind
    rows = registry.report()
    assert all(row.error is None and not row.clashes_with for kind in rows for row in rows[kind])
    assert registry.get(KL, "low_var_kl@tunix-ppo-ext") is kl.kl_k3
  finally:
    monkeypatch.undo()
    registry.clear_cache()


def test_builtin_advantage_estimators_declare_whether_they_need_a_critic():
  """Each built-in estimator's `needs_critic` is set, agrees with its signature (the rule
  for plugins that declare nothing) and decides `uses_critic`."""
  for entry in registry.entries(ADV):
    if not entry.builtin:
      continue
    assert isinstance(entry.needs_critic, bool), entry.name
    wanted = protocols.wanted_inputs(registry.get(ADV, entry.name))
    assert entry.needs_critic == ("values" in wanted), entry.name
    assert registry.needs_critic(entry.name) is entry.needs_critic
    config = PpoExtConfig(advantage_estimator=entry.name, num_generations=2)  # groups
    assert config.uses_critic is entry.needs_critic
  assert {e.name for e in registry.entries(ADV) if e.needs_critic} == {"gae", "turn_gae"}


TREE_MODULE = """
import jax.numpy as jnp


def mean_baseline(scores, mask):
  \"\"\"The score less the batch's mean, on every masked token.\"\"\"
  return (scores - jnp.mean(scores))[:, None] * mask


def values_baseline(rewards, values, mask):
  return (rewards - values) * mask, rewards * mask
"""


@pytest.fixture
def tree_builtin(tmp_path, monkeypatch):
  """`add(name, attribute, needs_critic)`: a row added to the built-ins' table for this test
  only, naming a function of a new module in a temporary source directory: what adding an
  estimator to the tree is, with no reinstall."""
  (tmp_path / "ppo_ext_tree_estimators.py").write_text(TREE_MODULE)
  monkeypatch.syspath_prepend(str(tmp_path))

  def add(name: str, attribute: str, needs_critic: bool) -> None:
    row = builtins.Builtin(f"ppo_ext_tree_estimators:{attribute}", needs_critic=needs_critic)
    monkeypatch.setitem(builtins.BUILTINS[ADV], name, row)

  yield add
  monkeypatch.undo()
  sys.modules.pop("ppo_ext_tree_estimators", None)
  registry.clear_cache()


def test_an_estimator_added_in_the_tree_works_without_reinstalling(tree_builtin):
  tree_builtin("test_mean_baseline", "mean_baseline", needs_critic=False)
  tree_builtin("test_values_baseline", "values_baseline", needs_critic=True)
  assert {"test_mean_baseline", "test_values_baseline"} <= set(registry.names(ADV))
  entry = registry.resolve(ADV, "test_mean_baseline@tunix-ppo-ext")
  assert (entry.distribution, entry.builtin) == ("tunix-ppo-ext", True)
  assert not estimator_takes_values("test_mean_baseline")  # the row says so: nothing loaded
  assert "ppo_ext_tree_estimators" not in sys.modules
  config = PpoExtConfig(advantage_estimator="test_mean_baseline")
  assert not config.uses_critic
  assert PpoExtConfig(advantage_estimator="test_values_baseline").uses_critic
  mask = jnp.ones((2, 3))
  advantages, _ = protocols.call_estimator(
    registry.get(ADV, "test_mean_baseline"),
    rewards=jnp.zeros((2, 3)),
    values=None,
    mask=mask,
    scores=jnp.array([1.0, 3.0]),
  )
  np.testing.assert_allclose(advantages, [[-1.0] * 3, [1.0] * 3])


def test_a_needs_critic_that_contradicts_the_signature_is_refused(tree_builtin):
  tree_builtin("test_wrong_flag", "values_baseline", needs_critic=False)
  with pytest.raises(registry.PluginError, match="built-in 'test_wrong_flag.*requires 'values'"):
    registry.get(ADV, "test_wrong_flag")
  with pytest.raises(registry.PluginError, match="needs_critic=True.*takes no 'values'"):
    registry.register(ADV, "test_bad", needs_critic=True)(lambda scores, mask: scores)
  with pytest.raises(ValueError, match="needs_critic is for advantage estimators"):
    registry.register(KL, "test_bad", needs_critic=True)


def test_in_code_estimators_may_declare_whether_they_need_a_critic():
  @registry.register(ADV, "test_any_inputs", needs_critic=False)
  def any_inputs(mask, **inputs):
    return inputs["scores"][:, None] * mask

  @registry.register(ADV, "test_any_inputs_default")
  def any_inputs_default(mask, **inputs):
    return inputs["scores"][:, None] * mask

  try:
    assert not PpoExtConfig(advantage_estimator="test_any_inputs").uses_critic
    assert PpoExtConfig(advantage_estimator="test_any_inputs_default").uses_critic  # **kwargs
  finally:
    registry.unregister(ADV, "test_any_inputs")
    registry.unregister(ADV, "test_any_inputs_default")


def test_unknown_names_list_the_available_ones_and_suggest_the_closest():
  with pytest.raises(registry.UnknownNameError) as info:
    registry.get(ADV, "gea")
  message = str(info.value)
  assert "unknown advantage estimator 'gea'; available: [" in message
  assert "'reinforce_plus_plus'" in message and message.endswith("did you mean 'gae'?")
  with pytest.raises(registry.UnknownNameError, match=r"unknown metric sink 'jsnol'.*'jsonl'\?"):
    registry.build(SINK, "jsnol", pathlib.Path("."), {})
  with pytest.raises(ValueError, match=r"'env.name'.*unknown environment 'memroy'.*'memory'\?"):
    load_run_config(None, ["env.name=memroy"])
  with pytest.raises(ValueError, match=r"no KL estimator 'abs' in distribution 'nope'"):
    registry.get(KL, "abs@nope")


def test_pinned_names_select_a_distribution():
  assert registry.get(KL, "low_var_kl@tunix-ppo-ext") is kl.kl_k3
  assert registry.get(KL, "low_var_kl@Tunix_PPO.ext") is kl.kl_k3  # PEP 503 normalised
  config = PpoExtConfig(kl_method="k3@tunix-ppo-ext+", advantage_estimator="gae@tunix-ppo-ext")
  assert config.kl_method == "low_var_kl@tunix-ppo-ext+"
  logp, ref = jnp.array([0.1, -2.0]), jnp.array([0.3, -0.5])
  np.testing.assert_array_equal(
    names.compute_kl_divergence(logp, ref, config.kl_method),
    names.compute_kl_divergence(logp, ref, "low_var_kl+"),
  )


# ----- in-code registration -----


def test_decorator_registration_works_everywhere_a_builtin_does():
  @registry.register(KL, "test_half_k1")
  def half_k1(logp, ref_logp):
    return 0.5 * (logp - ref_logp)

  try:
    entry = registry.resolve(KL, "test_half_k1")
    assert entry.distribution == registry.IN_CODE and entry.value.endswith("half_k1")
    config = PpoExtConfig(kl_method="test_half_k1+", kl_penalty="loss", kl_loss_coef=0.1)
    assert config.kl_method == "test_half_k1+" and "test_half_k1+" in names.kl_method_names()
    logp, ref = jnp.array([0.2, -1.0, -3.0]), jnp.array([0.0, -1.5, -1.0])
    value = names.compute_kl_divergence(logp, ref, "test_half_k1+")
    np.testing.assert_allclose(value, 0.5 * (logp - ref), rtol=1e-6)
    grad = jax.grad(lambda x: jnp.sum(names.compute_kl_divergence(x, ref, "test_half_k1+")))(logp)
    np.testing.assert_allclose(grad, logp - ref, rtol=1e-6)  # straight-through: k2's gradient
    registry.register(KL, "test_half_k1")(half_k1)  # re-running the same cell is fine
    with pytest.raises(registry.PluginError, match="already registered in code.*replace=True"):
      registry.register(KL, "test_half_k1")(lambda logp, ref_logp: logp)
  finally:
    registry.unregister(KL, "test_half_k1")
  assert not registry.has(KL, "test_half_k1")
  with pytest.raises(ValueError, match="Unknown KL method 'test_half_k1'"):
    names.compute_kl_divergence(jnp.zeros(2), jnp.zeros(2), "test_half_k1")


@pytest.mark.parametrize(
  "kind, name, obj, problem",
  [
    (KL, "test_bad", lambda logp, ref_logp, scale: logp, "missing a required argument: 'scale'"),
    (KL, "abs", lambda logp, ref_logp: logp, "distribution 'tunix-ppo-ext'.*another name"),
    (KL, "full", lambda logp, ref_logp: logp, "reserved"),
    (KL, "a+b", lambda logp, ref_logp: logp, "reserved or not of the form"),
    (KL, "test_bad", 3.0, "not callable"),
    (ADV, "test_bad", lambda rewards, temperature, mask: rewards, "'temperature'.*not one of"),
    (ADV, "test_bad", lambda rewards: rewards, "must take 'mask'"),
    (registry.VALUE_LOSSES, "test_bad", lambda model, train_example: 0.0, "cannot be called"),
    (SINK, "test_bad", lambda output_dir: None, "cannot be called"),
  ],
)
def test_decorator_registration_checks_the_protocol(kind, name, obj, problem):
  with pytest.raises(registry.PluginError, match=problem):
    registry.register(kind, name)(obj)
  assert name not in registry.names(kind) or name == "abs"


def test_built_products_are_checked(tmp_path):
  registry.register(ENV, "test_not_an_env")(lambda **kwargs: object())
  registry.register(SINK, "test_not_a_sink")(lambda output_dir, config: object())
  try:
    with pytest.raises(ValueError, match="in-code registration .* built .* is not an Environment"):
      envs.make_env("test_not_an_env")
    with pytest.raises(ValueError, match="is not a logging backend"):
      registry.build(SINK, "test_not_a_sink", tmp_path, {})
  finally:
    registry.unregister(ENV, "test_not_an_env")
    registry.unregister(SINK, "test_not_a_sink")


def test_losses_resolved_here_reach_tunix_function_registry():
  @registry.register(registry.POLICY_LOSSES, "test_scaled_ppo_ext")
  def scaled(model, train_example, algo_config, pad_id, eos_id, **kwargs):
    loss, metrics = ppo_ext_policy_loss_fn(
      model, train_example, algo_config, pad_id, eos_id, **kwargs
    )
    return 0.5 * loss, metrics

  @registry.register(registry.POLICY_LOSSES, "ppo")  # tunix's own `ppo` would win in tunix
  def shadowing(model, train_example, algo_config, pad_id, eos_id, **kwargs):
    return 0.0, {}

  try:
    assert (
      PpoExtConfig(policy_loss_fn="test_scaled_ppo_ext").policy_loss_fn == "test_scaled_ppo_ext"
    )
    with pytest.raises(LookupError):  # validating a config registers nothing
      function_registry.get_policy_loss_fn("test_scaled_ppo_ext")
    register_configured(PpoExtConfig(policy_loss_fn="test_scaled_ppo_ext"))  # for tunix's learners
    assert function_registry.get_policy_loss_fn("test_scaled_ppo_ext") is scaled
    with pytest.raises(
      ValueError, match=r"policy_loss_fn='ppo'.*tunix's function_registry already"
    ):
      PpoExtConfig(policy_loss_fn="ppo")
  finally:
    registry.unregister(registry.POLICY_LOSSES, "test_scaled_ppo_ext")
    registry.unregister(registry.POLICY_LOSSES, "ppo")
  assert PpoExtConfig(policy_loss_fn="ppo").policy_loss_fn == "ppo"  # tunix's own, as before


# ----- metric sinks -----


def test_sinks_config_key_and_the_jsonl_sink(tmp_path):
  assert load_run_config(None, ["sinks=[jsonl]"]).sinks == ["jsonl"]
  assert load_run_config(None).sinks == []
  with pytest.raises(ValueError, match=r"config key 'sinks' \('jsnol'\).*did you mean 'jsonl'"):
    load_run_config(None, ["sinks=[jsnol]"])
  with pytest.raises(ValueError, match=r"'sinks' must be list"):
    load_run_config(None, ["sinks=jsonl"])
  sink = registry.build(SINK, "jsonl", tmp_path, {"seed": 0})
  sink.log_scalar("actor/pg_loss", 0.5, step=3)
  sink.close()
  assert read_jsonl(tmp_path / "metrics.jsonl") == [{"step": 3, "actor/pg_loss": 0.5}]


# ----- installed plugins -----


def test_discovery_imports_nothing_and_loading_is_lazy_and_cached(use_plugins):
  use_plugins("example")
  assert "huber_kl" in registry.names(KL) and registry.has(ENV, "echo")
  assert "batch_baseline" in registry.RegistryView(
    registry.ADVANTAGE_ESTIMATORS
  )  # listing reads metadata only
  assert not _plugin_modules("ppo_ext_example_plugin")
  entry = registry.resolve(KL, "huber_kl")
  assert (entry.distribution, entry.version) == ("ppo-ext-example-plugin", "0.1.0")
  huber = registry.get(KL, "huber_kl")
  assert _plugin_modules("ppo_ext_example_plugin") == {
    "ppo_ext_example_plugin",
    "ppo_ext_example_plugin.kl",
  }  # only the module of the name looked up
  del sys.modules["ppo_ext_example_plugin.kl"]
  assert registry.get(KL, "huber_kl") is huber  # cached: not imported again
  assert "ppo_ext_example_plugin.kl" not in sys.modules
  registry.clear_cache()
  assert registry.get(KL, "huber_kl") is not huber  # after clearing: loaded afresh


def test_example_plugin_names_work_everywhere(use_plugins):
  use_plugins("example")
  config = PpoExtConfig(kl_method="huber_kl+", advantage_estimator="batch_baseline")
  assert config.kl_method == "huber_kl+"
  logp, ref = jnp.array([0.0, -0.5, -4.0]), jnp.array([0.0, 0.0, 0.0])
  value = names.compute_kl_divergence(logp, ref, "huber_kl+")
  np.testing.assert_allclose(value, [0.0, 0.125, 3.5], rtol=1e-6)  # Huber, delta 1
  with pytest.raises(ValueError, match="(?i)did you mean 'huber_kl'"):
    PpoExtConfig(kl_method="huber_k")
  # tunix's registry gets the estimator behind its GRPO signature (it takes `scores`)
  register_configured(config)  # for tunix's own learners (through compat.install)
  tunix_estimator = function_registry.get_advantage_estimator("batch_baseline")
  np.testing.assert_allclose(tunix_estimator(jnp.array([1.0, 2.0, 3.0, 6.0]), 2), [-2, -1, 0, 3])
  env = envs.make_env("echo", num_turns=3)
  observation, _ = env.reset(seed=0)
  total = 0.0
  for _ in range(3):
    observation, reward, done, _, _ = env.step(observation[0])
    total += reward
  assert done and total == env.max_return == 1.5


class _Recorder:
  """A metric sink that keeps what it receives."""

  def __init__(self, events: list):
    self.events = events

  def log_scalar(self, event, value, *, step):
    self.events.append((event, float(np.asarray(value)), step))

  def close(self):
    self.events.append(("closed", 0.0, -1))


def test_example_plugin_trains_the_smoke_config(use_plugins, tmp_path):
  use_plugins("example")
  events: list = []
  registry.register(SINK, "test_recorder")(lambda output_dir, config: _Recorder(events))
  args = ["train", "--config", str(CONFIGS / "smoke.yaml"), "--output-dir", str(tmp_path)]
  args += ["env.name=echo", "ppo.kl_method=huber_kl+", "ppo.advantage_estimator=batch_baseline"]
  try:
    assert cli.main([*args, "sinks=[test_recorder]"]) == 0
  finally:
    registry.unregister(SINK, "test_recorder")
  steps = load_run_config(str(CONFIGS / "smoke.yaml")).train.steps
  rows = read_jsonl(tmp_path / "metrics.jsonl")
  assert set(range(steps)) <= {row["step"] for row in rows}
  losses = [v for row in rows for k, v in row.items() if "loss" in k]
  assert losses and all(v is not None and math.isfinite(v) for v in losses), rows
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert summary["max_return"] == 1.0  # the echo environment's (memory's is 1.25)
  for module in ("kl", "advantages", "env"):
    assert f"ppo_ext_example_plugin.{module}" in sys.modules
  assert events[-1][0] == "closed" and {step for _, _, step in events[:-1]} >= set(range(steps))


def test_broken_and_clashing_plugins_fail_only_when_used(use_plugins, capsys):
  use_plugins("example", "broken", "clashing")
  assert {"broken_kl", "not_a_kl", "huber_kl", "low_var_kl"} <= set(registry.names(KL))
  with pytest.raises(ValueError) as info:
    PpoExtConfig(kl_method="broken_kl")
  message = str(info.value)
  for part in (
    "kl_method",
    "'broken_kl = ppo_ext_broken_plugin.missing_dependency:broken_kl'",
    "'ppo-ext-broken-plugin' 0.1.0",
    "ModuleNotFoundError: No module named 'ppo_ext_no_such_dependency'",
  ):
    assert part in message, message
  with pytest.raises(registry.PluginError, match="'ppo-ext-broken-plugin'.*does not satisfy"):
    names.compute_kl_divergence(jnp.zeros(2), jnp.zeros(2), "not_a_kl")
  with pytest.raises(ValueError, match="'ppo-ext-broken-plugin'.*is not an Environment"):
    envs.make_env("not_an_env")
  # the clash: the default `low_var_kl` (and its alias) are ambiguous now
  for method in ("low_var_kl", "k3+"):
    with pytest.raises(ValueError) as info:
      PpoExtConfig(kl_method=method)
    message = str(info.value)
    assert "'ppo-ext-clashing-plugin'" in message and "'tunix-ppo-ext'" in message, message
    assert "low_var_kl@" in message
  logp, ref = jnp.array([0.1, -2.0]), jnp.array([0.3, -0.5])
  ours = names.compute_kl_divergence(logp, ref, "low_var_kl@tunix-ppo-ext")
  np.testing.assert_allclose(ours, kl.kl_k3(logp, ref), rtol=1e-6)
  theirs = names.compute_kl_divergence(logp, ref, "low_var_kl@ppo-ext-clashing-plugin")
  np.testing.assert_allclose(theirs, jnp.abs(logp - ref), rtol=1e-6)
  # everything else keeps working
  config = PpoExtConfig(kl_method="huber_kl", advantage_estimator="batch_baseline")
  assert config.advantage_estimator == "batch_baseline"
  assert PpoExtConfig(kl_method="low_var_kl@tunix-ppo-ext").kl_method == "low_var_kl@tunix-ppo-ext"
  assert envs.make_env("echo").max_return == 1.0 and envs.make_env("memory").max_return == 1.25
  # and `plugins` lists all of it
  assert cli.main(["plugins"]) == 0
  rows = [line.split() for line in capsys.readouterr().out.splitlines()]
  by_name = {}
  for row in rows:
    by_name.setdefault(row[0], []).append(row)
  assert by_name["broken_kl"][0][1:5] == ["ppo-ext-broken-plugin", "0.1.0", "error:", "failed"]
  assert by_name["not_a_kl"][0][3:5] == ["error:", "does"]
  assert by_name["huber_kl"][0][1:4] == ["ppo-ext-example-plugin", "0.1.0", "ok"]
  clash = sorted(row[1] for row in by_name["low_var_kl"])
  assert clash == ["ppo-ext-clashing-plugin", "tunix-ppo-ext"]
  assert all("ok;" in row and "clash" in row for row in by_name["low_var_kl"])


def test_plugins_command_lists_every_group_with_builtins(capsys):
  assert cli.main(["plugins"]) == 0
  out = capsys.readouterr().out
  for kind in registry.KINDS:
    assert f"tunix_ppo_ext.{kind}:" in out
  rows = {tuple(line.split()[:4]) for line in out.splitlines()}
  for name in ("low_var_kl", "gae", "ppo_ext", "memory", "jsonl"):
    assert (name, "tunix-ppo-ext", tunix_ppo_ext.__version__, "ok") in rows


def test_docs_show_the_minimal_plugin_and_it_works(use_plugins):
  readme = (REPO / "docs" / "guides" / "plugins.md").read_text()
  source, _ = PLUGINS["minimal"]
  for name in ("pyproject.toml", "my_kl.py"):
    assert (source / name).read_text().strip() in readme, name
  assert "pip install ./examples/my-kl" in readme and "ppo.kl_method=cosh_kl" in readme
  use_plugins("minimal")
  assert load_resolved(None, ["ppo.kl_method=cosh_kl"]).ppo.kl_method == "cosh_kl"
  logp, ref = jnp.array([0.5, -1.0]), jnp.array([0.0, 0.0])
  value = names.compute_kl_divergence(logp, ref, "cosh_kl")
  np.testing.assert_allclose(value, np.cosh([0.5, -1.0]) - 1.0, rtol=1e-6)
