"""Shared test setup: the hypothesis profiles, toy data and reward functions, cluster
builders, and a reader for offline W&B run files.

Hypothesis: the `ci` profile (the default) is derandomized, so every run of the suite draws
the same examples, and prints the blob that replays a failure; set
`HYPOTHESIS_PROFILE=explore` to draw new random examples locally (more of them).

Toy data and clusters are tunix's own machinery: `RLCluster` with the "vanilla" rollout
engine, `rl_trainer.Trainer` with optax Adam, the Qwen3 models of
`tunix_ppo_ext._src.tunix.models.toy_models` and `CharTokenizer`; every role shares one
`(fsdp=1, tp=1)` mesh.

An offline W&B run file (`run-*.wandb`) is a LevelDB-style log: a 7-byte header (`:W&B`,
magic 0xBEE1, version), then 32 KiB blocks of records, each a 7-byte header (CRC32C,
length, type: 1 full, 2 first, 3 middle, 4 last) and a chunk of a serialized
`wandb_internal_pb2.Record`.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import importlib.util
import json
import multiprocessing
import os
import pathlib
import signal
import string
import struct
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from tests.helpers import compile_settings
from tests.helpers.import_graph import reaches_tunix

if TYPE_CHECKING:
  from flax import nnx

# How the suite compiles (the persistent cache, XLA:CPU's flags): set before jax is imported,
# inherited by every subprocess the tests start (tests/helpers/compile_settings.py)
os.environ.update(compile_settings.settings(os.environ))
JAX_CACHE = compile_settings.JAX_CACHE

# The subprocesses the tests start (`tunix-ppo-ext` commands, scripts) run without torch, as
# a user's install does: torch is the `[dev]` extra's, for the tests' own cross-checks with
# transformers. With it installed, importing tunix imports it (tunix's metrics logger ->
# metrax -> tensorboardX, which imports torch when it can): 1.5-3.5 CPU-s in every one of
# the suite's ~90 subprocesses. A `sitecustomize` on PYTHONPATH makes `import torch` raise
# ImportError there; the test processes themselves keep torch (`pytest_configure`).
NO_TORCH_SITE = JAX_CACHE.parent / "subprocess-site"


def pytest_configure(config) -> None:
  """In the processes that run tests (an xdist worker, or pytest without workers), the
  subprocesses they start get `NO_TORCH_SITE` on their PYTHONPATH."""
  if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
    return  # the xdist controller: its workers must keep torch
  NO_TORCH_SITE.mkdir(parents=True, exist_ok=True)
  site = NO_TORCH_SITE / "sitecustomize.py"
  if not site.is_file():
    text = "import sys\n\nsys.modules.setdefault('torch', None)  # import torch: ImportError\n"
    partial = site.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(text)
    partial.replace(site)  # the two workers write it at once
  paths = [str(NO_TORCH_SITE), *filter(None, [os.environ.get("PYTHONPATH")])]
  os.environ["PYTHONPATH"] = os.pathsep.join(paths)


# tunix's cluster builders, re-exported for the tests that build clusters; imported on
# first use, so that the fast lane (`pytest -m fast`) never imports tunix
_CLUSTER = "tunix_ppo_ext._src.tunix.cluster.cluster_setup"
_MESH = "tunix_ppo_ext._src.tunix.cluster.mesh"
_TUNIX_HELPERS = {"build_cluster": _CLUSTER, "make_mesh": _MESH, "make_models": _CLUSTER}


def __getattr__(name: str) -> Any:
  if name in _TUNIX_HELPERS:
    return getattr(importlib.import_module(_TUNIX_HELPERS[name]), name)
  raise AttributeError(f"module 'tests.conftest' has no attribute {name!r}")


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """Each test module runs over a frozen heap, and leaves no compiled program loaded.

  tunix collects garbage in full where it builds a cluster or a learner (`gc.collect()` in
  `RLCluster.__init__` and `show_hbm_usage`, and in some passes): a full collection walks
  every object of the xdist worker's heap, which grows with every module it ran (a tenth of
  a worker's samples under py-spy were those collections). The heap a module finds is
  frozen (`gc.freeze`) while its tests run, so those collections walk only what the module
  made; at its end the heap is unfrozen and collected once.

  After each test module JAX's in-memory caches are cleared, which unloads the compiled
  programs the module left loaded. Each loaded XLA:CPU program holds about six memory
  mappings; an xdist worker that kept the whole suite's (about 10,000) passed the kernel's
  65,530 (`vm.max_map_count`) and died loading the next one from the persistent cache (a
  segfault or abort in `compilation_cache.get_executable_and_time`, in all three full runs
  on 2026-12-04). A later module reloads what it needs from that cache."""
  gc.freeze()
  yield
  gc.unfreeze()
  if "jax" in sys.modules:
    sys.modules["jax"].clear_caches()
  gc.collect()


@pytest.fixture(autouse=True)
def _frozen_heap_per_test():
  """Each test starts over a frozen heap too: tunix's full collections during a test walk
  only what the test made, not what the module's earlier tests left (their clusters and
  traced programs). Timed by `gc.callbacks` on `test_learner.py` + `test_shared_prompts.py`
  in one process: 26.3 s in collections with the module's freeze alone, 5.6 s with this
  (peak memory 2.3 -> 2.9 GB: the module's garbage waits for its end). The module's end
  unfreezes and collects it all (above)."""
  gc.freeze()


settings.register_profile(
  "ci",
  derandomize=True,
  print_blob=True,
  deadline=None,
  database=None,
  suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("explore", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

TARGET_CHAR = "a"


def record_turns(monkeypatch) -> list[tuple[list[list[int]], Any]]:
  """Spies on the multi-turn rollout's real sampler: every turn's `(contexts, TurnOutput)`
  (`output.tokens[row]`, `output.logprobs[row]`), in call order."""
  from tunix_ppo_ext._src.tunix.rollout.continuing_sampler import Conversation

  original, turns = Conversation.turn, []

  def turn(self, contexts, active, sampling, fresh_width):
    output = original(self, contexts, active, sampling, fresh_width)
    turns.append(([list(c) for c in contexts], output))
    return output

  monkeypatch.setattr(Conversation, "turn", turn)
  return turns


def flush_subnormals(x: Any) -> np.ndarray:
  """`x` as float32 with subnormals set to (signed) zero, as XLA computes on CPU.

  A comparison that means "unchanged" holds up to this; normal values are untouched.
  """
  x = np.asarray(x, np.float32)
  return np.where(np.abs(x) < np.finfo(np.float32).tiny, np.float32(0) * x, x)


class MetricsRecorder:
  """The learner's one surface a trajectory source uses, `rl_cluster.buffer_metrics`,
  recorded: `metrics[key]` is the value, `modes[key]` the mode it was buffered under."""

  def __init__(self):
    self.rl_cluster, self.metrics, self.modes = self, {}, {}

  def buffer_metrics(self, metrics: dict[str, tuple[Any, Any]], mode: Any) -> None:
    for key, (value, _) in metrics.items():
      self.metrics[key], self.modes[key] = value, mode


def train_in_process(config: str | pathlib.Path, out: pathlib.Path, *overrides: str) -> Any:
  """Trains `config` with `overrides` into the new directory `out` as `train` does (its
  `config.json` written first, so `export` and reruns find it) and returns the learner, its
  cluster closed."""
  from tunix_ppo_ext._src.run import job, run_dir
  from tunix_ppo_ext._src.run.run_config import load_resolved

  resolved = load_resolved(str(config), [f"output_dir={out}", *overrides])
  out.mkdir()
  run_dir.check_rerun(out, resolved.config, None, resolved.optimizers)
  learner, batches, eval_batches, _ = job.build_run(resolved, out)
  learner.train(batches, eval_ds=eval_batches)
  learner.rl_cluster.close()
  return learner


def train_argv(
  config: str | os.PathLike, output_dir: str | os.PathLike, *overrides: str
) -> list[str]:
  """The command line's `train --config CONFIG --output-dir OUTPUT_DIR OVERRIDES...`."""
  return ["train", "--config", str(config), "--output-dir", str(output_dir), *overrides]


def make_prompts(num: int, seed: int = 0, length: int = 2) -> tuple[list[str], list[str]]:
  """`num` prompts `"say <word>:"` and answers (`<word>`), random lowercase words.

  With BOS a prompt is `length + 6` tokens: keep it <= `max_prompt_length`, since the
  sampler does not truncate but pads longer prompts to the next power of two.
  """
  rng = np.random.default_rng(seed)
  letters = np.array(list(string.ascii_lowercase))
  words = ["".join(rng.choice(letters, size=length)) for _ in range(num)]
  return [f"say {w}:" for w in words], words


def make_prompts_dataset(
  num_batches: int, batch: int, seed: int = 0, word_length: int = 2
) -> list[dict[str, np.ndarray]]:
  """`num_batches` batches `{"prompts": [batch] str array, "answer": [batch] str array}`.

  Arrays, not lists: tunix's learner `np.repeat`s every leaf of a batch, which would turn
  each string of a Python list into its own array.
  """
  prompts, answers = make_prompts(num_batches * batch, seed, word_length)
  return [
    {"prompts": np.array(prompts[i : i + batch]), "answer": np.array(answers[i : i + batch])}
    for i in range(0, num_batches * batch, batch)
  ]


def iterate_forever(batches: Sequence[dict[str, np.ndarray]]) -> Iterator[dict[str, np.ndarray]]:
  """Cycles through `batches` (the learner stops at `max_steps`)."""
  while True:
    yield from batches


def target_char_reward(prompts: Sequence[str], completions: Sequence[str], **_) -> list[float]:
  """Fraction of each completion's characters that are `TARGET_CHAR` (0 for empty)."""
  return [c.count(TARGET_CHAR) / len(c) if c else 0.0 for c in completions]


def echo_answer_reward(
  prompts: Sequence[str], completions: Sequence[str], answer: Sequence[str], **_
) -> list[float]:
  """Fraction of the answer's characters that the completion reproduces in place."""
  return [_matched_fraction(c, str(t)) for c, t in zip(completions, answer, strict=True)]


def _matched_fraction(completion: str, target: str) -> float:
  """Share of `target`'s positions where `completion` has the same character."""
  hits = sum(a == b for a, b in zip(completion, target, strict=False))
  return hits / max(len(target), 1)


def param_leaf(model: nnx.Module) -> np.ndarray:
  """A host copy of one trained leaf (first decoder layer's q projection)."""
  return np.array(model.layers[0].attn.q_proj.w[...])


_BLOCK = 32768
_HEADER = struct.Struct("<IHB")


def _records(data: bytes) -> Iterator[bytes]:
  ident, magic, _ = struct.unpack("<4sHB", data[:7])
  assert ident == b":W&B" and magic == 0xBEE1, (ident, magic)
  pos, pending = 7, b""
  while pos + _HEADER.size <= len(data):
    left = _BLOCK - pos % _BLOCK
    if left < _HEADER.size:
      pos += left
      continue
    _, length, kind = _HEADER.unpack_from(data, pos)
    if kind == 0:  # zero padding up to the end of the block
      pos += left
      continue
    if pos + _HEADER.size + length > len(data):
      return  # a record still being written (the reader waits for the run's exit record)
    chunk = data[pos + _HEADER.size : pos + _HEADER.size + length]
    pos += _HEADER.size + length
    if kind == 1:
      yield chunk
    elif kind == 2:
      pending = chunk
    elif kind == 3:
      pending += chunk
    elif kind == 4:
      yield pending + chunk


def _key(item: Any) -> str:
  """W&B stores a key with `/` as its list of parts (`nested_key`)."""
  return item.key or "/".join(item.nested_key)


def toy_cluster(
  tokenizer: Any,
  seed: int = 0,
  *,
  prompt_len: int,
  tokens_per_call: int,
  max_steps: int = 2,
  batch: int = 4,
  with_critic: bool = True,
  with_reference: bool = True,
  **kwargs: Any,
) -> Any:
  """A tunix cluster of toy models (`make_models(tokenizer, seed)`, the critic left out
  with `with_critic=False`, the reference with `with_reference=False`): `prompt_len` prompt
  tokens, `tokens_per_call` generated tokens per engine call; the policy is
  `cluster.actor_trainer.model`. `kwargs` are `ClusterSpec` fields or `build_cluster`
  keywords."""
  import dataclasses

  from tunix_ppo_ext.models import ClusterSpec, build_cluster, make_models

  fields = {field.name for field in dataclasses.fields(ClusterSpec)}
  spec = ClusterSpec(
    max_steps=max_steps,
    batch=batch,
    max_prompt_length=prompt_len,
    max_tokens_to_generate=tokens_per_call,
    **{key: value for key, value in kwargs.items() if key in fields},
  )
  policy, critic, reference = make_models(tokenizer, seed=seed)
  others = {key: value for key, value in kwargs.items() if key not in fields}
  reference = reference if with_reference else None
  return build_cluster(
    policy, critic if with_critic else None, tokenizer, spec, reference=reference, **others
  )


def multi_turn_learner(
  tokenizer: Any, seed: int, source: Any, config: Any = None, *, prompt_len: int, **kwargs: Any
) -> Any:
  """`PpoExtLearner(cluster, config or PpoExtConfig(), trajectory_source=source)` on a
  `toy_cluster` sized for the multi-turn `source` (room per engine call for its whole width
  plus one turn), the sampler's log-probs returned. The cluster is `learner.rl_cluster`;
  `kwargs` go to `toy_cluster`."""
  from tunix_ppo_ext import PpoExtConfig, PpoExtLearner

  width = source.max_completion_len + source.max_turn_tokens
  cluster = toy_cluster(
    tokenizer, seed, prompt_len=prompt_len, tokens_per_call=width, return_logprobs=True, **kwargs
  )
  return PpoExtLearner(cluster, config or PpoExtConfig(), trajectory_source=source)


def replayed_group(monkeypatch, learner: Any, seed: int) -> tuple[Any, list[tuple[int, list]]]:
  """One training batch of the learner's multi-turn source on 2 episodes of one seed, the
  engine's outputs recorded (`record_turns`): `(batch, rows)`, `rows[i]` the episode seed
  of row `i` and the agent's token ids of each of its turns, to replay on the environment."""
  from tunix_ppo_ext._src.data.trajectory import episode_batches
  from tunix_ppo_ext._src.tunix.rollout.multi_turn import Mode

  source = learner.trajectory_source
  turns = record_turns(monkeypatch)  # the real sampler, its outputs kept
  data = {k: np.repeat(v, 2, axis=0) for k, v in next(episode_batches(1, 2, seed=seed)).items()}
  batch = source(learner, data, Mode.TRAIN)
  monkeypatch.undo()
  batch.validate()
  outputs = [output for _, output in turns]
  rows = []
  for row, episode in enumerate(data["seed"]):
    played = outputs[: int(batch.num_turns[row])]
    rows.append((int(episode), [out.tokens[row].tolist() for out in played]))
  return batch, rows


def assert_row_is(batch: Any, row: int, tokens: list[int], loss: list[int]) -> None:
  """Row `row` of `batch` holds `tokens` with loss mask `loss`, cut to the batch's width
  and padded out of the attention mask."""
  width = batch.completion_ids.shape[1]
  n = min(len(tokens), width)
  np.testing.assert_array_equal(batch.completion_ids[row][:n], tokens[:n])
  np.testing.assert_array_equal(batch.loss_mask[row], loss[:n] + [0] * (width - n))
  np.testing.assert_array_equal(batch.attention_mask[row], [1] * n + [0] * (width - n))


def assert_training_moves_the_policy(learner: Any, steps: int = 2) -> None:
  """`learner` trains `steps` steps on episode batches and the policy's weights move."""
  from tunix_ppo_ext._src.data.trajectory import episode_batches

  trainer = learner.rl_cluster.actor_trainer
  before = param_leaf(trainer.model)
  learner.train(episode_batches(steps, 2, seed=0))
  assert trainer.train_steps == steps and not np.allclose(param_leaf(trainer.model), before)


def read_wandb_run(
  path: str | pathlib.Path, timeout_s: float = 120.0
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
  """`(history rows, config)` of an offline run file (config values JSON-decoded).

  Waits until the run's `exit` record is in the file: `run.finish()` can return before
  W&B's service process has written the last records (seen under load); after `timeout_s`
  it reads what is there.
  """
  from wandb.proto import wandb_internal_pb2

  deadline = time.monotonic() + timeout_s
  while True:
    records = [
      wandb_internal_pb2.Record.FromString(raw) for raw in _records(pathlib.Path(path).read_bytes())
    ]
    if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
      break
    time.sleep(0.05)
  history, config = [], {}
  for record in records:
    kind = record.WhichOneof("record_type")
    if kind == "history":
      history.append({_key(item): json.loads(item.value_json) for item in record.history.item})
    elif kind == "run":
      for item in record.run.config.update:
        config[item.key] = json.loads(item.value_json)
    elif kind == "config":
      for item in record.config.update:
        config[item.key] = json.loads(item.value_json)
  return history, config


def save_weights_only(model: Any, directory: str | pathlib.Path) -> pathlib.Path:
  """`model`'s Hugging Face `model.safetensors` (`tunix_ppo_ext.models.save_hf_checkpoint`,
  the export) without its `config.json`: a checkpoint of weights only, whose sizes the run
  config gives. Returns the safetensors file."""
  from tunix_ppo_ext.models import save_hf_checkpoint

  directory = save_hf_checkpoint(model, directory, None)
  (directory / "config.json").unlink()
  return directory / "model.safetensors"


def toy_policy(vocab_size, seed=7, **sizes):
  """A toy tunix Qwen3 policy (1 layer, width 32 unless `sizes` say otherwise)."""
  sizes = {
    "num_layers": 1,
    "embed_dim": 32,
    "hidden_dim": 64,
    "num_heads": 2,
    "head_dim": 32,
    "num_kv_heads": 1,
    **sizes,
  }
  from tunix_ppo_ext._src.tunix.models import toy_models

  return toy_models.make_policy(toy_models.tiny_qwen3_config(vocab_size, **sizes), seed)


def save_hf_tokenizer(directory: pathlib.Path, alphabet: str) -> None:
  """A character-level Hugging Face tokenizer built offline (`tokenizers` + `transformers`)."""
  from tokenizers import Tokenizer, decoders, pre_tokenizers
  from tokenizers import models as tok_models
  from transformers import PreTrainedTokenizerFast

  vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{c: i + 3 for i, c in enumerate(alphabet)}}
  tokenizer = Tokenizer(tok_models.WordLevel(vocab=vocab, unk_token="<pad>"))
  tokenizer.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
  tokenizer.decoder = decoders.Fuse()
  PreTrainedTokenizerFast(
    tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
  ).save_pretrained(directory)


def save_byte_level_tokenizer(directory: pathlib.Path, vocab_size: int = 270) -> None:
  """A byte-level BPE tokenizer (as Qwen2's and Llama 3's are) trained offline on a few
  environment texts: every byte is a token, so any text round-trips, also when
  transformers loads it as the `Qwen2Tokenizer` a `qwen2` config.json picks."""
  from tokenizers import ByteLevelBPETokenizer
  from transformers import PreTrainedTokenizerFast

  bpe = ByteLevelBPETokenizer()
  corpus = ["see c! take? cash? ok k", "use 1 2 3 to make 4", "##.. g.bp pfff"] * 10
  special = ["<pad>", "<s>", "</s>"]
  bpe.train_from_iterator(corpus, vocab_size=vocab_size, special_tokens=special)
  PreTrainedTokenizerFast(
    tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
  ).save_pretrained(directory)


SMOKE = pathlib.Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml"


def load_bench(name: str) -> Any:
  """`bench/<name>.py` as a module (the bench scripts are not a package; their shared
  `bench/_timing.py` is imported as the scripts run do: from their own folder)."""
  path = pathlib.Path(__file__).resolve().parents[1] / "bench" / f"{name}.py"
  if str(path.parent) not in sys.path:
    sys.path.append(str(path.parent))
  spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def smoke_args(out: pathlib.Path, *overrides: str) -> list[str]:
  """`tunix-ppo-ext train`'s arguments for the smoke config into `out` (for `cli.main`)."""
  return ["train", "--config", str(SMOKE), "--output-dir", str(out), *overrides]


def train_command(out: pathlib.Path, *overrides: str) -> list[str]:
  """`tunix-ppo-ext train` on the smoke config into `out`, as a subprocess command."""
  return [sys.executable, "-m", "tunix_ppo_ext._src.run.cli", *smoke_args(out, *overrides)]


def subprocess_env(tmp_path: pathlib.Path) -> dict[str, str]:
  """One CPU device, and the suite's persistent compilation cache (`JAX_CACHE`, in
  `os.environ`) so a run skips the compiling other tests did."""
  del tmp_path  # the cache is the suite's, not the test's
  return {**os.environ, "JAX_PLATFORMS": "cpu"}


def _hold_run_lock(out: pathlib.Path, held: Any) -> None:
  from tunix_ppo_ext._src.run import run_dir

  signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # leaves the `with`: releases it
  with run_dir.RunLock(out):
    held.set()
    while True:
      time.sleep(60)


@contextlib.contextmanager
def run_lock_holder(out: pathlib.Path) -> Iterator[Any]:
  """Another process (forked: it imports nothing) holding `out`'s run lock until the block
  ends (SIGTERM: it releases the lock as a run does), unless the block kills it first;
  yields the `multiprocessing.Process`."""
  context = multiprocessing.get_context("fork")
  held = context.Event()
  process = context.Process(target=_hold_run_lock, args=(out, held), daemon=True)
  with warnings.catch_warnings():  # the child runs no JAX: JAX's threads are no danger
    warnings.filterwarnings("ignore", "os.fork", RuntimeWarning)
    process.start()
  try:
    assert held.wait(60), f"the holder never took {out}'s lock (exit {process.exitcode})"
    yield process
  finally:
    process.terminate()
    process.join(30)
    if process.is_alive():
      process.kill()
      process.join()


def common_checkpoints(out: pathlib.Path, roles: Sequence[str] = ("actor", "critic")) -> set[int]:
  """Steps every trainer of `roles` checkpointed under `out/checkpoints` (a run with a
  group estimator has no critic: `roles=("actor",)`)."""
  from tunix_ppo_ext._src.run import resume

  ckpt = out / "checkpoints"
  return set.intersection(*(resume.finalized_steps(ckpt / role) for role in roles))


def pytest_ignore_collect(collection_path: pathlib.Path, config) -> bool | None:
  """With `-m fast`, the test files that reach tunix are not even imported."""
  fast_lane = config.getoption("markexpr", "") == "fast"
  if fast_lane and collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
    return True if reaches_tunix(collection_path.resolve()) else None
  return None


def pytest_addoption(parser) -> None:
  parser.addoption(
    "--shuffle-seed",
    type=int,
    default=None,
    help="run the collected tests in an order shuffled with this seed (order-dependence hunts)",
  )


# The suite's test seconds (`tests/durations.json`, from a full run's `--durations=N` on the
# 2-core machine; refresh it with `python tests/durations.py LOG`): the test files run
# longest first, so that xdist's workers end together instead of one of them running a long
# file alone at the end (longest first, as a list scheduler would). Each file's tests stay
# together, in their own order: a file's module-scoped fixtures (a trained run, a loaded
# model) are built once, and its compiled programs are released once (above), where a
# test-by-test order rebuilt them at every change of file (354 changes on one worker).
# Data for the order only: no test reads it.
DURATIONS = pathlib.Path(__file__).with_name("durations.json")


def pytest_collection_modifyitems(config, items):
  """The fast lane (`pytest -m fast`): every test whose file never reaches tunix, neither
  directly nor through this package or the tunix helpers above (`tests/helpers/import_graph.py`).
  The test files run longest first by their tests' seconds in `DURATIONS`, each file's
  tests together in their collected order. With `--shuffle-seed N` the tests run in an
  order shuffled with `N` instead (reproducible)."""
  for item in items:
    if not reaches_tunix(pathlib.Path(str(item.fspath))) and not item.get_closest_marker("slow"):
      item.add_marker(pytest.mark.fast)
  seed = config.getoption("shuffle_seed")
  if seed is not None:
    import random

    random.Random(seed).shuffle(items)
    return
  items[:] = by_file_longest_first(items, json.loads(DURATIONS.read_text()))


def by_file_longest_first(items: list, seconds: dict[str, float]) -> list:
  """`items` grouped by file, the files longest first (the sum of their tests' `seconds`,
  by node id; a test not there counts 0), each file's tests in their given order."""
  files: dict[str, list] = {}
  for item in items:
    files.setdefault(item.nodeid.split("::")[0], []).append(item)
  total = {name: sum(seconds.get(i.nodeid, 0.0) for i in tests) for name, tests in files.items()}
  return [i for name in sorted(files, key=lambda name: -total[name]) for i in files[name]]
