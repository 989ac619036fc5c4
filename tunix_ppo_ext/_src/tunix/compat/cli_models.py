"""Local checkpoints in tunix main's pipeline (`tunix-ppo-ext tunix-agentic`), with no network.

tunix's `create_model` loads `model_source: huggingface` through its `hf_pipeline`, which
lists the Hub repository's files even when `model_id` or `model_path` is a directory on disk
(`Missing HF_TOKEN`, then minutes of retries), and its `Tokenizer` calls `transformers`
without `local_files_only`. Here a model config whose `model_source` is `local`, or
`huggingface` with a `model_path` / `model_id` that is a local checkpoint (a Hugging Face
directory, a `.gguf` file or one of this package's GGUF short names, `is_local_ref`), loads
with the loader the pipeline gives (`models.local_checkpoints.load_local_model`: this
package's `hf_models.load_checkpoint`), and a `huggingface` tokenizer whose
`tokenizer_path` is local (or empty, with a local actor) with `AutoTokenizer(...,
local_files_only=True)`. Every other config goes to tunix's own code.

What tunix offers no public way to do, each with its reason (used by `cli_hooks.
PipelineHooks`, pinned on tunix main by tests/tunix/learner/test_agentic_local_checkpoint.py):

- `local_models_in`: `BasePipeline.create_rl_engine` builds the reference and critic
  by calling `tunix.cli.utils.model.create_model` through that module (its `model_lib`)
  and has no hook for a model of another source: the attribute is swapped for the call
  for the call, local configs loaded by the pipeline's loader, the rest by tunix's.
- `LocalTokenizer`: tunix's `Tokenizer` (what its pipeline, dataset and parsers expect)
  built around a tokenizer loaded here: its `__init__` loads by path, so this one sets
  what that `__init__` sets (`tokenizer_type`, then `TokenizerAdapter.__init__`).
- `HiddenStatesLlama3`: tunix's pipeline makes a critic of every family with a
  `score_weight_d1` its `TransformerWithScoreHead`, which calls the backbone with
  `output_hidden_states=True` and reads its `all_hidden_states` intermediate, as tunix's
  Gemma, Qwen2 and Qwen3 write it; tunix's Llama 3 (SmolLM2's family) takes no such
  argument. A local Llama 3 is this subclass, whose `__call__` adds it (`hidden_states_of`).
- the config checks tunix runs as it parses the YAML (`HyperParameters.
  _validate_model_source`, `check_supported_workflow`, `_validate_tokenizer`) refuse
  `model_source: local`, ask for `intermediate_ckpt_dir` and `HF_TOKEN`, and allow Gemma 3
  only from GCS: `PipelineHooks` skips them for a local model or tokenizer
  (`is_local_model`, `local_tokenizer_ref`); `local_checkpoints.check_local_models`
  checks those instead.
"""

from __future__ import annotations

import contextlib
import pathlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from flax import nnx
from tunix.generate import tokenizer_adapter as tokenizer_lib
from tunix.models.llama3 import model as llama3

from tunix_ppo_ext._src.data import gguf_files

try:
  from tunix.cli.utils import model as model_lib
except ImportError:  # tunix 0.1.7: no pipeline
  model_lib = None

LOCAL = "local"  # the `model_source` of a local checkpoint
HUGGINGFACE = "huggingface"  # tunix's source whose local paths also load here
ROLE_KEYS = (
  "model_config",
  "actor_model_config",
  "reference_model_config",
  "critic_model_config",
  "rollout_model_config",
)


def is_local_ref(ref: Any) -> bool:
  """Whether `ref` names a local checkpoint: a directory, a `.gguf` file or one of this
  package's GGUF short names (`gguf_files.SHORT_NAMES`)."""
  if not isinstance(ref, str) or not ref:
    return False
  return pathlib.Path(ref).is_dir() or gguf_files.is_gguf(ref)


def local_model_ref(model_config: Mapping[str, Any] | None) -> str | None:
  """The local checkpoint a model config names (None: tunix loads it): `model_path` (else
  `model_id`) of `model_source: local`, or of `huggingface` where it is local."""
  if not model_config:
    return None
  source = model_config.get("model_source")
  refs = [model_config.get(key) for key in ("model_path", "model_id")]
  if source == LOCAL:
    return next((ref for ref in refs if ref), None) or ""
  if source == HUGGINGFACE:
    return next((ref for ref in refs if is_local_ref(ref)), None)
  return None


def is_local_model(model_config: Mapping[str, Any] | None) -> bool:
  """Whether this package loads the model config's checkpoint (`local_model_ref`)."""
  return local_model_ref(model_config) is not None


def local_tokenizer_ref(config: Mapping[str, Any]) -> str | None:
  """The local tokenizer of a pipeline config (None: tunix's `Tokenizer` loads it): a
  `huggingface` `tokenizer_path` that `is_local_ref`, or, with none, the local actor's (or
  `model_config`'s) checkpoint."""
  tokenizer = config.get("tokenizer_config") or {}
  if tokenizer.get("tokenizer_type") != HUGGINGFACE:
    return None
  path = tokenizer.get("tokenizer_path")
  if path:
    return path if is_local_ref(path) else None
  return local_model_ref(config.get("actor_model_config") or config.get("model_config")) or None


class HiddenStatesLlama3(llama3.Llama3):
  """tunix's Llama 3 whose `__call__` also takes `output_hidden_states`, as tunix's Gemma
  and Qwen models do: the final norm's output sown as the `all_hidden_states`
  intermediate (what tunix's `TransformerWithScoreHead` reads)."""

  def __call__(
    self,
    input_tokens: Any,
    positions: Any,
    cache: Any,
    attention_mask: Any,
    skip_lm_head: bool = False,
    output_hidden_states: bool = False,
  ) -> tuple[Any, Any]:
    hidden, cache = super().__call__(
      input_tokens, positions, cache, attention_mask, skip_lm_head=True
    )
    if output_hidden_states:
      self.sow(nnx.Intermediate, "all_hidden_states", hidden)
    if skip_lm_head:
      return hidden, cache
    return self.compute_final_logits(hidden), cache


def hidden_states_of(model: nnx.Module) -> nnx.Module:
  """`model`, a tunix Llama 3 made a `HiddenStatesLlama3` (in place); other families, which
  take `output_hidden_states` already, as they are."""
  if type(model) is llama3.Llama3:
    model.__class__ = HiddenStatesLlama3
  return model


@contextlib.contextmanager
def local_models_in(load: Callable[..., tuple[nnx.Module, str]]) -> Iterator[None]:
  """For the block, tunix's `create_model(model_config, tokenizer_config, mesh)` (which
  `create_rl_engine` calls through `tunix.cli.utils.model`) is `load` (same arguments and
  result) for a local checkpoint (`is_local_model`), tunix's own for any other."""
  tunix_create_model = model_lib.create_model

  def create_model(model_config: Any, tokenizer_config: Any, mesh: Any) -> Any:
    if is_local_model(model_config):
      return load(model_config, tokenizer_config, mesh)
    return tunix_create_model(model_config, tokenizer_config, mesh)

  model_lib.create_model = create_model
  try:
    yield
  finally:
    model_lib.create_model = tunix_create_model


class LocalTokenizer(tokenizer_lib.Tokenizer):
  """tunix's `huggingface` `Tokenizer` of a local directory (or GGUF reference), loaded by
  `transformers.AutoTokenizer` with `local_files_only=True` and tunix's own arguments."""

  def __init__(self, ref: str, add_bos: bool | None = None, add_eos: bool | None = None) -> None:
    import transformers  # as tunix's Tokenizer: only for this type

    hf = transformers.AutoTokenizer.from_pretrained(
      gguf_files.resolve(ref),
      add_bos_token=add_bos,
      add_eos_token=add_eos,
      extra_special_tokens={},
      local_files_only=True,
    )
    self.tokenizer_type = HUGGINGFACE  # what tunix's `Tokenizer.__init__` sets first
    tokenizer_lib.TokenizerAdapter.__init__(self, hf)


def local_tokenizer(config: Mapping[str, Any]) -> LocalTokenizer | None:
  """The config's local tokenizer (`local_tokenizer_ref`), None when tunix loads it."""
  ref = local_tokenizer_ref(config)
  if ref is None:
    return None
  tokenizer = config.get("tokenizer_config") or {}
  return LocalTokenizer(ref, tokenizer.get("add_bos"), tokenizer.get("add_eos"))
