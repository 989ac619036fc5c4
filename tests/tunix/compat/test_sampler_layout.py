"""The layout of tunix's sampling state and KV cache, which `ContinuingSampler` keeps between
turns, is pinned in one place (`compat.sampler_internals`): the `_SamplingState` fields it
uses (`compat.STATE_FIELDS`) and each layer's cache keys (`compat.CACHE_KEYS`) are checked
on live states of the families it continues, and no module outside `compat` names them."""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tunix.generate import sampler as sampler_lib

from tests.helpers.hf_fixtures import hf_config
from tunix_ppo_ext._src.data.char_tokenizer import CharTokenizer
from tunix_ppo_ext._src.tunix import compat
from tunix_ppo_ext._src.tunix.models import hf_models
from tunix_ppo_ext._src.tunix.rollout.continuing_sampler import CONTINUABLE

# tunix_facing: also run on tunix main (.ci/run, lane 2)
pytestmark = [pytest.mark.tunix, pytest.mark.tunix_facing]

PACKAGE = pathlib.Path(__file__).resolve().parents[3] / "tunix_ppo_ext"
COMPAT = PACKAGE / "_src" / "tunix" / "compat"
PAD, EOS = 0, 2
ROWS, WIDTH, SLOTS, TOKENS = 3, 4, 12, 5
# The fields no other object of the package has: any use of them as an attribute, a keyword
# or a string is the sampling state's. The others (`positions`, `cache`, `done`, `seed`) are
# common words (an episode is `done`, a config has a `seed`, `functools.cache`): they count
# as the state's where the object is named as one (`state`, `s`, `..._state`), read or
# replaced (`dataclasses.replace(state, ...)`).
OWN_FIELDS = {"decoding_step", "token_buffer", "total_sampling_steps", "num_input_tokens"}
OWN_FIELDS |= {"logprobs_buffer"}
STATE_NAMES = ("state", "s")
HF_NAMES = {"Qwen2": "qwen2", "Qwen3": "qwen3", "Llama3": "llama"}  # the families continued


def _live_state(family: type):
  """`(model config, state)`: a tiny tunix `family` model's sampling state, set up for a turn
  and prefilled by tunix's own prefill, as `ContinuingSampler` does (unjitted)."""
  config = hf_models.tunix_config(hf_config(HF_NAMES[family.__name__]).to_dict())
  model = family(config, rngs=nnx.Rngs(0))
  cache = sampler_lib.CacheConfig(SLOTS, config.num_layers, config.num_kv_heads, config.head_dim)
  sampler = sampler_lib.Sampler(
    model, CharTokenizer("abcdefghijklmnopq", pad_id=PAD, eos_id=EOS), cache
  )
  ids = np.array([[PAD, 5, 6, 7], [8, 9, 10, 11], [PAD, PAD, 12, 13]], np.int32)
  settings = dict(temperature=1.0, top_p=1.0, top_k=None, seed=0, with_logprobs=True)
  state = compat.fresh_state(sampler, jnp.asarray(ids), SLOTS, **settings)
  active = np.array([True, True, False])
  state = compat.set_up_turn(state, active, WIDTH, TOKENS, prefill_width=WIDTH)
  prefill, _ = compat.sampler_step_functions(sampler, [EOS])
  _, params = sampler.model_def_and_state()
  args, kwargs = compat.prefill_arguments(params, state)
  return config, prefill(*args, **kwargs)


@pytest.mark.parametrize("family", CONTINUABLE, ids=lambda family: family.__name__)
def test_the_sampling_state_and_cache_have_the_pinned_layout(family):
  """tunix's state has every field `compat` uses (`num_input_tokens` static), each layer's
  cache the keys `compat` uses with keys and values `[B, S, KV, H]`, and the model writes
  from `end_index` and moves it past what it wrote; `compat`'s readers agree."""
  assert {f.__name__ for f in CONTINUABLE} == set(HF_NAMES)
  config, state = _live_state(family)
  assert type(state).__name__ == "_SamplingState"
  fields = {f.name: f for f in dataclasses.fields(state)}
  assert set(compat.STATE_FIELDS) <= set(fields), sorted(set(compat.STATE_FIELDS) - set(fields))
  assert not fields["num_input_tokens"].metadata.get("pytree_node", True)  # static
  assert len(state.cache) == config.num_layers
  kv_shape = (ROWS, SLOTS, config.num_kv_heads, config.head_dim)
  for layer in state.cache.values():
    assert set(layer) == set(compat.CACHE_KEYS)
    assert layer["k"].shape == layer["v"].shape == kv_shape
    # the model wrote the prefilled keys from `end_index` and moved it past them
    np.testing.assert_array_equal(layer["end_index"], [WIDTH] * ROWS)
  reverse = jnp.broadcast_to(jnp.arange(SLOTS - 1, -1, -1), (ROWS, SLOTS))
  gathered = compat.gather_cache_slots(state, reverse)
  for name, layer in state.cache.items():
    np.testing.assert_array_equal(gathered[name]["k"], layer["k"][:, ::-1])
    np.testing.assert_array_equal(gathered[name]["v"], layer["v"][:, ::-1])
  assert int(state.decoding_step) == WIDTH  # the first sample, at the turn's first slot
  assert int(compat.turn_first_slot(state, TOKENS)) == WIDTH
  np.testing.assert_array_equal(state.done, [False, False, True])
  tokens, step, logprobs = compat.turn_buffers(state, with_logprobs=True)
  assert tokens.shape == logprobs.shape == (ROWS, SLOTS) and step == WIDTH
  written = compat.cache_written_from(state, jnp.int32(1))
  assert all(np.all(layer["end_index"] == 1) for layer in written.values())


def _is_state(node: ast.expr) -> bool:
  """Whether the expression names a sampling state (`state`, `s`, `self._state`, ...)."""
  name = ast.unparse(node).rsplit(".", 1)[-1]
  return name in STATE_NAMES or name.endswith("_state")


def _layout_uses(source: str) -> list[str]:
  """Where `source` reads or writes a sampling-state field or a KV-cache key."""
  found = []
  for node in ast.walk(ast.parse(source)):
    where = f"{getattr(node, 'lineno', '?')}"
    if isinstance(node, ast.Attribute) and node.attr in compat.STATE_FIELDS:
      if node.attr in OWN_FIELDS or _is_state(node.value):
        found.append(f"{where}: .{node.attr}")
    elif isinstance(node, ast.keyword) and node.arg in OWN_FIELDS:
      found.append(f"{where}: {node.arg}=")
    elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("replace") and node.args:
      fields = [k.arg for k in node.keywords if k.arg in compat.STATE_FIELDS]
      found += [f"{where}: replace({name}=)" for name in fields if _is_state(node.args[0])]
    elif isinstance(node, ast.Constant) and node.value in OWN_FIELDS | {"end_index"}:
      found.append(f"{where}: {node.value!r}")
    elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
      if node.slice.value in compat.CACHE_KEYS:
        found.append(f"{where}: [{node.slice.value!r}]")
    elif isinstance(node, ast.Dict):
      keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
      found += [f"{where}: {{{k!r}: ...}}" for k in keys if k in compat.CACHE_KEYS]
  return found


def test_the_layout_scan_finds_every_kind_of_use():
  """Field reads and writes, keywords, strings, cache subscripts and dict keys are found;
  the common words on other objects are not."""
  source = textwrap.dedent("""
    a = state.token_buffer[:, s.decoding_step]
    b = self._state.seed, sampler_state.done, x.done, config.seed, functools.cache
    c = dataclasses.replace(state, done=d, cache=c), dataclasses.replace(config, seed=1)
    d = init(total_sampling_steps=3)
    e = {name: {**layer, "k": layer["v"]} for name, layer in cache.items()}
    f = getattr(state, "num_input_tokens"), layer["end_index"]
  """)
  found = [use.split(": ", 1)[1] for use in _layout_uses(source)]
  assert sorted(found) == sorted([
    ".token_buffer", ".decoding_step", ".seed", ".done", "replace(done=)", "replace(cache=)",
    "total_sampling_steps=", "{'k': ...}", "['v']", "'num_input_tokens'", "'end_index'",
    "['end_index']",
  ])  # fmt: skip


def test_no_module_outside_compat_touches_the_sampling_state_layout():
  """Every module of the package outside `compat/` reaches the sampling state and the KV
  cache through `compat`'s functions only."""
  found = []
  for path in sorted(PACKAGE.rglob("*.py")):
    if not path.is_relative_to(COMPAT):
      found += [f"{path.relative_to(PACKAGE)}:{use}" for use in _layout_uses(path.read_text())]
  assert not found, found


@pytest.mark.parametrize("family", CONTINUABLE, ids=lambda family: family.__name__)
def test_an_empty_kv_cache_has_the_layout_of_tunix_s_own(family):
  """`compat.empty_kv_cache` (the shared-prompt training pass's cache) has the structure,
  shapes and dtypes of the cache tunix's sampler builds (layer names, keys, `[B, S, KV, H]`,
  the int32 next slot), empty; `kv_rows` picks rows of every leaf."""
  config, state = _live_state(family)
  dtype = state.cache["layer_0"]["k"].dtype
  ours = compat.empty_kv_cache(config, ROWS, SLOTS, dtype)
  want = jax.tree.map(lambda x: (x.shape, x.dtype), state.cache)
  assert jax.tree.map(lambda x: (x.shape, x.dtype), ours) == want
  assert all(not np.asarray(x).any() for x in jax.tree.leaves(ours))
  picked = compat.kv_rows(state.cache, jnp.asarray([2, 0]))
  for name, layer in picked.items():
    for key, value in layer.items():
      np.testing.assert_array_equal(value, np.asarray(state.cache[name][key])[[2, 0]])
