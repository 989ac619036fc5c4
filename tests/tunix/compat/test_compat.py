"""`tunix/compat/` is the one seam to tunix's private names, pinned to the tested tunix
versions (tests/tunix/compat/test_sampler_layout.py pins the sampler's state and cache layout)."""

from __future__ import annotations

import ast
import importlib
import inspect
import pathlib
import re
import warnings

import numpy as np
import pytest
import tunix
from tunix.generate import sampler as sampler_lib
from tunix.rl import rl_cluster
from tunix.rl import utils as rl_utils
from tunix.rl.agentic import agentic_rl_learner
from tunix.rl.agentic.trajectory import trajectory_collect_engine
from tunix.rl.ppo import ppo_learner
from tunix.rl.rollout import vanilla_rollout
from tunix.sft import peft_trainer

from tunix_ppo_ext._src.tunix import compat
from tunix_ppo_ext._src.tunix.compat import tunix_versions

# tunix_facing: also run on tunix main (.ci/run, lane 2)
pytestmark = [pytest.mark.tunix, pytest.mark.tunix_facing]

PACKAGE = pathlib.Path(__file__).resolve().parents[3] / "tunix_ppo_ext"
COMPAT = PACKAGE / "_src" / "tunix" / "compat"
TUNIX_SOURCE = pathlib.Path(tunix.__file__).parent
# Non-self objects our own code may set attributes on (our dataclasses and functions, and
# Python's own `sys` hooks: `disk_space.quiet_write_failures` sets `sys.unraisablehook`).
# the package's own objects: names that are never a tunix object where they are assigned to
# (the run config being built; loss functions named and documented where they are made)
# names of this package's objects and of the standard library's modules (`sys`, and
# `futures_thread`: the run's exit wakes idle thread-pool workers as the interpreter does)
OWN_OBJECTS = {"episode", "batch", "config", "sys", "instance", "loss_fn", "policy_loss_fn"}
OWN_OBJECTS |= {"futures_thread"}
# the standard library's `warnings`, as `sys`: the command line shows its own warnings
# (`warnings.showwarning`, inside `catch_warnings`, which puts it back)
OWN_OBJECTS |= {"warnings"}
# `toy_models.value_model`'s `backbone`: a copy of the policy made there, whose LM head it
# drops (`del backbone.lm_head`), not the policy itself
OWN_OBJECTS |= {"backbone"}


def test_installed_tunix_is_the_tested_one_and_has_every_pinned_name():
  assert compat.tunix_version() in compat.TESTED_TUNIX
  assert compat.EXPECTED_API[compat.tunix_version()] == compat.tunix_api()
  assert compat.missing_names() == []
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    compat.check_tunix()  # silent on the tested version


def test_the_api_is_read_from_tunix_itself():
  """main (0.1.8) renamed `RLCluster` to `RLEngine` and kept the old name as an alias."""
  has_engine = hasattr(rl_cluster, "RLEngine")
  assert compat.tunix_api() == (compat.API_MAIN if has_engine else compat.API_0_1_7)
  if has_engine:
    assert rl_cluster.RLCluster is rl_cluster.RLEngine


@pytest.mark.parametrize(
  ("version", "api"), [("0.1.8", compat.API_0_1_7), ("0.1.7", compat.API_MAIN)]
)
def test_a_version_string_with_the_other_api_is_untested(monkeypatch, version, api):
  monkeypatch.setattr(tunix_versions, "tunix_version", lambda: version)
  monkeypatch.setattr(tunix_versions, "tunix_api", lambda: api)
  with pytest.warns(UserWarning, match=rf"untested with google-tunix {version} .*{api} API"):
    compat.check_tunix()


@pytest.mark.parametrize("version", ["0.1.7", "0.1.8"])
def test_each_tested_version_with_its_api_is_silent(monkeypatch, version):
  monkeypatch.setattr(tunix_versions, "tunix_version", lambda: version)
  monkeypatch.setattr(tunix_versions, "tunix_api", lambda: compat.EXPECTED_API[version])
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    compat.check_tunix()


def test_pinned_instance_attributes_are_set_by_tunix_constructors():
  owners = {
    "PPOLearner": ppo_learner.PPOLearner,
    "PeftTrainer": peft_trainer.PeftTrainer,
    "VanillaRollout": vanilla_rollout.VanillaRollout,
    "RLCluster": rl_cluster.RLCluster,
    "Sampler": sampler_lib.Sampler,
  }
  for owner, names in compat.PINNED_INSTANCE_ATTRIBUTES.items():
    classes = [c for c in owners[owner].__mro__ if c.__module__.startswith("tunix.")]
    source = "".join(inspect.getsource(c) for c in classes)
    for name in names:
      assigned = re.search(rf"self\.{name}\s*(:[^=\n]*)?=|self\.{name},", source)
      assert assigned, (owner, name)


def test_an_untested_tunix_fails_loudly_when_a_name_moved(monkeypatch):
  monkeypatch.setattr(tunix_versions, "tunix_version", lambda: "9.9.9")
  compat.PINNED["fake"] = (object(), ("_gone",))
  try:
    with pytest.raises(RuntimeError, match=r"9\.9\.9 lacks \['fake\._gone'\].*google-tunix=="):
      compat.check_tunix()
  finally:
    del compat.PINNED["fake"]
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    compat.check_tunix()
  assert any("untested with google-tunix 9.9.9" in str(w.message) for w in caught)


def _private_names(files) -> set[str]:
  """Private names the files define: functions, classes, assigned attributes and globals."""
  names = set()
  for path in files:
    try:
      tree = ast.parse(path.read_text(errors="ignore"))
    except SyntaxError:
      continue
    for node in ast.walk(tree):
      if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        names.add(node.name)
      elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
        names.add(node.attr)
      elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
        names.add(node.id)
  return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_no_private_tunix_name_outside_compat():
  ours = [p for p in PACKAGE.rglob("*.py") if not p.is_relative_to(COMPAT)]
  tunix_private = _private_names(TUNIX_SOURCE.rglob("*.py")) - _private_names(ours)
  found = []
  for path in ours:
    for match in re.finditer(r"\.(_[A-Za-z]\w*)\b", path.read_text()):
      if match.group(1) in tunix_private:
        found.append(f"{path.relative_to(PACKAGE)}: .{match.group(1)}")
  assert not found, found


# What the rule below recognizes as a change to a foreign (tunix, qwix or metrax) object, in
# a module outside compat:
# - an assignment, augmented assignment or `del` of an attribute (`X.a = ...`), and a call
#   of `setattr`, `delattr` or `object.__setattr__` on X, where X is: a name imported from
#   tunix, qwix or metrax; any name but `self`, `cls` and `OWN_OBJECTS` (so a cluster,
#   engine, rollout, trainer or sampler passed in is foreign, whatever it is called); or an
#   attribute chain through one of `FOREIGN_ATTRIBUTES` (`self.rl_cluster.rollout.x = ...`);
# - any assignment to `__class__` (a class swapped), even on `self`;
# - a call of a compat function that makes a `PROCESS` or `CLUSTER` patch (`PATCHES`) other
#   than through `compat.install` / `compat.prepare`, unless on `self` (an instance of this
#   package's own subclass, e.g. `ContinuingSampler`).
# It does not follow aliases (`c = self.rl_cluster; c.x = ...` is caught as `c`, a name not
# own) nor mutation through methods (`d.update(...)`); attributes of `self` in this
# package's subclasses of tunix classes are the subclass's own state.
FOREIGN_PACKAGES = ("tunix", "qwix", "metrax")
FOREIGN_ATTRIBUTES = {
  "rl_cluster", "rl_engine", "cluster", "engine", "rollout", "actor_trainer",
  "critic_trainer", "trainer", "sampler", "_sampler", "inference_worker", "transformer",
}  # fmt: skip
# compat's own objects: thread-locals, a copy it makes, the closures it returns, the AST
# nodes `source_hash` parses
COMPAT_OWN = {"self", "cls", "_CALL", "_CAPTURED", "snapshot", "build", "init_sample_state"}
COMPAT_OWN |= {"node"}


def _foreign_imports(tree: ast.AST) -> set[str]:
  """Names the module binds to tunix, qwix or metrax modules and objects."""
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names |= {
        (a.asname or a.name).split(".")[0]
        for a in node.names
        if a.name.split(".")[0] in FOREIGN_PACKAGES
      }
    elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in FOREIGN_PACKAGES:
      names |= {a.asname or a.name for a in node.names}
  return names


def _changed_objects(node: ast.AST) -> list[tuple[ast.AST, str]]:
  """`(object, attribute)` whose attribute `node` assigns, deletes or sets (`setattr`)."""
  targets = []
  if isinstance(node, ast.Assign | ast.Delete):
    targets = node.targets
  elif isinstance(node, ast.AugAssign | ast.AnnAssign):
    targets = [node.target]
  elif isinstance(node, ast.Call) and node.args:
    func = ast.unparse(node.func)
    if func in ("setattr", "delattr"):
      return [(node.args[0], "?")]
    if func == "object.__setattr__":
      return [(node.args[0], "?")]
  found = []
  for target in targets:
    for part in ast.walk(target):  # tuple targets: `a.x, b.y = ...`
      if isinstance(part, ast.Attribute) and isinstance(part.ctx, ast.Store | ast.Del):
        found.append((part.value, part.attr))
  return found


def _is_foreign(obj: ast.AST, attr: str, own: set[str], imported: set[str]) -> bool:
  """Whether setting `obj.attr` changes a foreign object (the rule's comment above)."""
  if attr == "__class__":
    return True
  chain = []
  while isinstance(obj, ast.Attribute):
    chain.append(obj.attr)
    obj = obj.value
  base = obj.id if isinstance(obj, ast.Name) else None
  if base in imported or any(name in FOREIGN_ATTRIBUTES for name in chain):
    return True
  return base not in own


def _cluster_patch_functions() -> set[str]:
  """Names of the compat functions that make a `PROCESS` or `CLUSTER` patch."""
  scopes = (compat.patches.PROCESS, compat.patches.CLUSTER)
  return {
    function.split(".")[-1]
    for patch in compat.PATCHES.values()
    if patch.scope in scopes
    for function in patch.functions
  }


def _foreign_changes(source: str, own: set[str], calls: set[str] = frozenset()) -> list[str]:
  """`line: what` for each change to a foreign object in `source` (the rule above), and each
  call of one of `calls` (patch functions) on anything but `self`."""
  tree = ast.parse(source)
  imported, found = _foreign_imports(tree), []
  for node in ast.walk(tree):
    for obj, attr in _changed_objects(node):
      if _is_foreign(obj, attr, own, imported):
        found.append(f"{node.lineno}: {ast.unparse(obj)}.{attr}")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name):
      name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
      on_self = bool(node.args) and ast.unparse(node.args[0]) == "self"
      if name in calls and not on_self:
        found.append(f"{node.lineno}: {ast.unparse(node.func)}(...) outside install/prepare")
  return found


def test_no_change_to_a_tunix_qwix_or_metrax_object_outside_compat():
  """Every change to a foreign object is a compat `PATCHES` entry: nothing outside compat
  assigns to one, swaps a class, or applies a process or cluster patch itself."""
  calls, found = _cluster_patch_functions(), []
  for path in PACKAGE.rglob("*.py"):
    if not path.is_relative_to(COMPAT):
      lines = _foreign_changes(path.read_text(), {"self", "cls"} | OWN_OBJECTS, calls)
      found += [f"{path.relative_to(PACKAGE)}:{line}" for line in lines]
  assert not found, found


@pytest.mark.parametrize(
  ("source", "flagged"),
  [
    ("cluster.rollout.generate = f", True),  # an instance passed in
    ("self.rl_cluster.actor_trainer._pbar = bar", True),  # through a foreign attribute
    ("from qwix._src.providers import lora\nlora._compute_lora_delta = f", True),
    ("from tunix.rl import rl_cluster\nrl_cluster.RLCluster.x = 1", True),  # a class
    ("setattr(trainer, '_pbar', bar)", True),
    ("object.__setattr__(engine, 'x', 1)", True),
    ("self.__class__ = Other", True),  # a class swapped, even on self
    ("compat.silence_progress_bar(trainer)", True),  # a cluster patch, not via prepare
    ("compat.adjust_sampler(self.rl_cluster)", True),
    ("compat.prepare(cluster, quiet_trainers=True)", False),
    ("compat.sample_without_training_options(self)", False),  # our own subclass instance
    ("self.state = s; self.value_head.w = w", False),  # this package's own objects
    ("config.kl_coef = 0.1", False),  # an own name (`OWN_OBJECTS`)
  ],
)
def test_the_rule_recognizes_changes_to_foreign_objects(source, flagged):
  found = _foreign_changes(source, {"self", "cls"} | OWN_OBJECTS, _cluster_patch_functions())
  assert bool(found) == flagged, found


def _functions_changing_foreign_objects(path: pathlib.Path) -> set[str]:
  """`module.function` of each top-level function (or class method, `module.Class.method`)
  of a compat module that changes a foreign object (nested functions count for the
  function that defines them)."""
  tree = ast.parse(path.read_text())
  imported, found = _foreign_imports(tree), set()
  tops = [(n.name, n) for n in tree.body if isinstance(n, ast.FunctionDef)]
  for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
    tops += [(f"{cls.name}.{n.name}", n) for n in cls.body if isinstance(n, ast.FunctionDef)]
  for name, function in tops:
    for node in ast.walk(function):
      if any(_is_foreign(o, a, COMPAT_OWN, imported) for o, a in _changed_objects(node)):
        found.add(f"{path.stem}.{name}")
  return found


def test_every_change_to_a_foreign_object_in_compat_is_in_the_patch_table():
  """Each compat function that assigns to a foreign object (or swaps its class) is one of
  the functions a `PATCHES` entry names; each entry names real functions, a known scope,
  a reason and a pin whose test files exist."""
  listed = {f for patch in compat.PATCHES.values() for f in patch.functions}
  changing = set().union(*map(_functions_changing_foreign_objects, COMPAT.glob("*.py")))
  assert changing - listed == set()
  for name, patch in compat.PATCHES.items():
    assert patch.scope in compat.patches.SCOPES and patch.reason and patch.target, name
    for function in patch.functions:
      module, _, attribute = function.partition(".")
      part = importlib.import_module(f"tunix_ppo_ext._src.tunix.compat.{module}")
      assert callable(getattr(part, attribute, None)), (name, function)
    for test_file in re.findall(r"tests/[\w/]+\.py", patch.pin):
      assert (PACKAGE.parent / test_file).is_file(), (name, test_file)


def test_copied_and_skipped_tunix_bodies_are_the_pinned_ones():
  """`SOURCE_PINS`: every tunix (and qwix) body compat copies or skips has the source hash
  pinned for the installed tunix (both lanes: 0.1.7 and main)."""
  assert compat.tunix_version() in compat.TESTED_TUNIX
  assert compat.changed_bodies() == []
  assert all(set(pin.hashes) == set(compat.TESTED_TUNIX) for pin in compat.SOURCE_PINS.values())


def test_the_pins_read_the_definitions_not_the_attributes_install_replaced():
  """`install` replaces qwix's `_compute_lora_delta` with ours: the pin still hashes qwix's
  own body, in whatever order the suite runs (it hashed ours once a test had installed)."""
  from qwix._src.providers import lora as qwix_lora

  from tunix_ppo_ext._src.tunix.compat import qwix_adapters

  qwix_own = qwix_adapters.QWIX_LORA_DELTA
  compat.install()
  assert qwix_lora._compute_lora_delta is not qwix_own  # ours is in place
  path = "qwix._src.providers.lora._compute_lora_delta"
  assert compat.defined_hash(path) == compat.source_hash(inspect.getsource(qwix_own))
  assert compat.changed_bodies() == []


def test_a_changed_body_fails_its_pin_naming_what_to_re_read(monkeypatch):
  path = "tunix.rl.rl_learner.RLLearner._process_accumulated_batches"
  pin = compat.SOURCE_PINS[path]
  version = compat.tunix_version()
  monkeypatch.setitem(pin.hashes, version, "0" * 16)
  [line] = compat.changed_bodies()
  assert line.startswith(f"{path} changed on google-tunix {version}")
  assert "re-read compat/learner_hooks.py: LearnerHooks._process_accumulated_batches" in line
  # an untested tunix whose body is no tested version's: named in `check_tunix`'s warning
  for tested in compat.TESTED_TUNIX:
    monkeypatch.setitem(pin.hashes, tested, "0" * 16)
  monkeypatch.setattr(tunix_versions, "tunix_version", lambda: "9.9.9")
  with pytest.warns(UserWarning, match=r"9\.9\.9 .*changed: .*_process_accumulated_batches"):
    compat.check_tunix()
  # formatting, comments and docstrings are not a change; a changed statement is
  compact = "def f(x):\n  return x + 1\n"
  spaced = 'def f(x):\n    """Doc."""\n    # a comment\n    return (\n      x  # same\n      + 1)\n'
  assert compat.source_hash(spaced) == compat.source_hash(compact)
  assert compat.source_hash(compact) != compat.source_hash(compact.replace("1", "2"))


def test_qwen2_rope_tables_are_the_rotary_sinusoids():
  """sin/cos of `position / theta**(2i/d)` (RoFormer, Su et al. 2021), `i < d/2`."""
  positions = np.array([[0, 1, 5, 1000]])
  sin, cos = compat.qwen2_rope_tables(positions, 8, 1e6)
  angle = positions[..., None] / (1e6 ** (np.arange(4) * 2 / 8))
  np.testing.assert_allclose(np.asarray(sin).reshape(angle.shape), np.sin(angle), atol=1e-5)
  np.testing.assert_allclose(np.asarray(cos).reshape(angle.shape), np.cos(angle), atol=1e-5)


def test_tunix_opens_its_progress_bar_only_where_none_is_in_place():
  """`silence_progress_bar` relies on `PeftTrainer.train` keeping a bar already in place and
  calling nothing on it but what the stand-in has."""
  source = inspect.getsource(peft_trainer.PeftTrainer)
  guard = r"if self\.config\.max_steps is not None and self\._pbar is None:\n\s+self\._pbar = "
  assert re.search(guard, source) and source.count("progress_bar.ProgressBar(") == 1
  called = set(re.findall(r"self\._pbar\.(\w+)\(", source))
  assert called == {"update_metrics", "update", "close"}
  assert all(callable(getattr(compat.SilentProgressBar, name)) for name in called)
  trainer = peft_trainer.PeftTrainer.__new__(peft_trainer.PeftTrainer)
  compat.silence_progress_bar(trainer)
  trainer._pbar.update_metrics(["loss"], "train", ndigits=3)  # as tunix calls it


def test_tunix_s_agentic_learner_calls_its_hooks_as_agentic_hooks_takes_them():
  """`AgenticHooks._process_results` takes tunix's three keywords; `agentic_rewards` passes
  `_compute_rewards` its keywords (both tested versions)."""
  source = inspect.getsource(agentic_rl_learner.AgenticRLLearner)
  call = r"self\._process_results\(\s*trajectories=\w+,\s*mode=mode,\s*expected_step=\w+,?\s*\)"
  assert len(re.findall(r"self\._process_results\(", source)) == 1 and re.search(call, source)
  hook = inspect.signature(compat.AgenticHooks._process_results).parameters
  assert list(hook) == ["self", "trajectories", "mode", "expected_step"]
  rewards = inspect.signature(agentic_rl_learner.AgenticRLLearner._compute_rewards).parameters
  assert list(rewards)[:5] == ["self", "prompts", "completions", "mode", "expected_step"]
  assert "kwargs" in rewards


def test_tunix_s_agentic_loop_hands_each_model_call_its_token_budget():
  """`AgenticHooks._model_call` caps a call through `turn_budget` (`max_tokens_per_turn`):
  tunix's collect engine passes `max_generation_steps` (the rest of the episode's budget) by
  keyword, and `_model_call` hands it on to the engine's `generate` (both tested versions)."""
  step = inspect.getsource(trajectory_collect_engine.TrajectoryCollectEngine._one_step)
  assert "max_generation_steps=max_generation_steps" in step
  assert re.search(r"self\.max_response_length - self\._response_token_count", step)
  call = inspect.getsource(agentic_rl_learner.AgenticRLLearner._model_call)
  assert re.search(r"generate\([^)]*max_generation_steps=max_generation_steps", call, re.S)
  hook = inspect.signature(compat.AgenticHooks._model_call).parameters
  assert list(hook) == list(
    inspect.signature(agentic_rl_learner.AgenticRLLearner._model_call).parameters
  )


def test_tunix_s_packed_loop_hands_each_chunk_to_the_packed_rows_hook():
  """tunix main's `train`, with `max_seq_token_per_tpu`, passes each chunk of packed rows
  through `_compute_packed_logps` (`AgenticHooks` forwards it to `packed_example`) and trains
  what it returns; tunix 0.1.7 has neither (nothing pinned there)."""
  learner = agentic_rl_learner.AgenticRLLearner
  if not hasattr(rl_cluster, "RLEngine"):
    assert not hasattr(learner, "_compute_packed_logps") and not compat.PACKING_HOOKS
    return
  assert compat.PACKING_HOOKS == ("_compute_packed_logps",)
  assert list(inspect.signature(learner._compute_packed_logps).parameters) == ["self", "example"]
  source = inspect.getsource(learner.train)
  call = r"(\w+) = self\._compute_packed_logps\(\s*(\w+)\s*\)"
  [(name, argument)] = re.findall(call, source)
  assert name == argument and source.index("_compute_packed_logps(") < source.index("update_actor(")
  assert "rl_utils.pack_sequences(" in source and "unpad_train_example(" in inspect.getsource(
    rl_utils.pack_sequences
  )


def test_needs_main_reads_tunix_main_s_api(monkeypatch):
  """`AgenticPpoLearner` runs on tunix main only: the probe is main's `RLEngine`."""
  if hasattr(rl_cluster, "RLEngine"):
    compat.needs_main("X")  # silent on main
    monkeypatch.delattr(rl_cluster, "RLEngine")
  with pytest.raises(
    RuntimeError, match=r"^X needs tunix main \(google-tunix >= 0\.1\.8, .*c7d8950f"
  ):
    compat.needs_main("X")


def test_cli_hooks_pins_tunix_main_s_ppo_pipeline():
  """`compat.cli_hooks` (imported by the `tunix-agentic` command alone, not checked with
  `PINNED`): its names are on tunix main's `PpoPipeline`, whose `run_trainer` calls the
  `_run(mode=...)` it overrides; tunix 0.1.7 has no such pipeline and it pins nothing."""
  from tunix_ppo_ext._src.tunix.compat import cli_hooks

  if cli_hooks.ppo_main is None:
    assert not hasattr(rl_cluster, "RLEngine") and cli_hooks.PINNED == {}
    return
  [(obj, names)] = cli_hooks.PINNED.values()
  assert [name for name in names if not hasattr(obj, name)] == []
  assert "self._run(mode=mode)" in inspect.getsource(obj.run_trainer)
  assert "Agentic PPO is not yet supported" in inspect.getsource(obj._run)
