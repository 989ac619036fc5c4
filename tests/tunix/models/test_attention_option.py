"""`model.attention`: tunix's splash attention switched on for the families that have it,
refused in one line naming the key everywhere it cannot run (another family, a row that is
not whole blocks, a backend or compiler other than the TPU's); `blockwise` (Qwen3's layers
through `ops.segment_attention`) equal to dense attention in log-probs and gradients."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tunix.models.llama3 import model as llama3_model

from tests.helpers.runs import SMOKE
from tunix_ppo_ext._src.checks import ConfigError
from tunix_ppo_ext._src.config.model_spec import ModelSpec
from tunix_ppo_ext._src.run import cli, job, plan
from tunix_ppo_ext._src.run.run_config import load_resolved
from tunix_ppo_ext._src.tunix import compat
from tunix_ppo_ext._src.tunix.learner import passes
from tunix_ppo_ext._src.tunix.models import hf_models, toy_models
from tunix_ppo_ext.metrics import read_jsonl

pytestmark = pytest.mark.tunix

ROWS = ["train.max_prompt_length=64", "env.max_completion_len=64"]  # 128 tokens a row


def test_splash_sets_tunix_s_flash_flag_and_block_on_qwen3_and_keeps_dense_as_it_was():
  config = toy_models.tiny_qwen3_config(16)
  assert hf_models.with_attention(config, "dense", 512) is config
  splash = hf_models.configured(config, ModelSpec("block", "splash", 256))
  assert splash.use_flash_attention and splash.flash_attention_block_size == 256
  assert splash.remat_config.name == "BLOCK" and not config.use_flash_attention


def test_a_family_without_splash_is_refused_naming_the_key():
  config = llama3_model.ModelConfig.llama3p2_1b()
  with pytest.raises(ConfigError, match=r"'model.attention'='splash': not for tunix's llama3"):
    hf_models.with_attention(config, "splash", 512)
  with pytest.raises(ConfigError, match=r"'blockwise': not for tunix's llama3 .*qwen3 has it"):
    hf_models.with_attention(config, "blockwise", 512)
  planned = plan.model_config(load_resolved("configs/smollm2.yaml", [], need_files=False))
  with pytest.raises(ConfigError, match=r"'splash': not for tunix's llama3 model"):  # SmolLM2
    hf_models.with_attention(planned.config, "splash", 512)


@pytest.mark.parametrize(
  ("overrides", "message"),
  [
    (["model.attention=flash"], r"'model.attention'='flash' unknown; did you mean 'splash'"),
    (
      ["model.attention=splash", "model.attention_block_size=64", *ROWS],
      "must be an integer >= 128",
    ),
    (["model.attention=splash", *ROWS], r"'model.attention_block_size'=512 must divide .* 128"),
  ],
)
def test_bad_attention_settings_are_one_line_naming_the_key(overrides, message):
  with pytest.raises(ConfigError, match=message):
    load_resolved(SMOKE, overrides)


def test_splash_is_refused_off_the_tpu_before_any_model_is_built(tmp_path, capsys):
  settings = ["model.attention=splash", "model.attention_block_size=128", *ROWS]
  load_resolved(SMOKE, settings)  # a valid config: only the backend is wrong
  command = ["train", "--config", str(SMOKE), "--output-dir", str(tmp_path / "run"), *settings]
  assert cli.main(command) == cli.EXIT_BAD_INPUT
  assert "runs tunix's TPU splash kernel, not on cpu" in capsys.readouterr().err
  with pytest.raises(ConfigError, match="not on cpu"):
    plan.plan(load_resolved(SMOKE, settings), "v5e:1x1", ["actor/logps_pass"], "cpu")
  job.check_attention_backend("splash", "tpu")  # the TPU's: accepted
  job.check_attention_backend("dense", "cpu")


def test_the_trainers_get_splash_and_the_sampler_attends_densely_over_its_cache(
  tmp_path, monkeypatch
):
  """Built as `train` builds it (the TPU check lifted: nothing runs here), the actor and the
  critic carry tunix's flash flag while the rollout's sampler graph does not (tunix's splash
  path takes no KV cache)."""
  monkeypatch.setattr(job, "check_attention_backend", lambda *args: None)
  settings = ["model.attention=splash", "model.attention_block_size=128", *ROWS]
  resolved = load_resolved(SMOKE, [*settings, f"output_dir={tmp_path}"])
  learner, *_ = job.build_run(resolved, tmp_path)
  cluster = learner.rl_cluster
  assert cluster.actor_trainer.model.config.use_flash_attention
  assert cluster.critic_trainer.model.backbone.config.use_flash_attention
  sampler = cluster.rollout._sampler
  flags = [
    module.config.use_flash_attention
    for _, module in nnx.iter_graph(
      nnx.merge(sampler._transformer_graphdef, nnx.state(sampler.transformer))
    )
    if hasattr(getattr(module, "config", None), "use_flash_attention")
  ]
  assert flags and not any(flags)
  cluster.close()


def _padded_rows(vocab: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Prompts left-padded, completions right-padded, one row all but one token padding."""
  rng = np.random.default_rng(0)
  prompt, completion = rng.integers(3, vocab, (3, 7)), rng.integers(3, vocab, (3, 9))
  prompt[0, :3] = prompt[2, :6] = 0
  mask = np.ones((3, 9), np.int32)
  mask[1, 5:] = mask[2, 1:] = 0
  completion[mask == 0] = 0
  return prompt, completion, mask


def _with_frequencies(config, theta: float) -> hf_models.Qwen3Config:
  """`config` as a loaded checkpoint's: RoPE inverse frequencies of `theta`, not tunix's 1e6."""
  fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
  inv_freq = 1.0 / theta ** (np.arange(0, config.head_dim, 2) / config.head_dim)
  return hf_models.Qwen3Config(**fields, rope_inv_freq=tuple(inv_freq.astype(np.float32).tolist()))


# one block; several, with a partial last one; and a checkpoint's own RoPE (theta 100):
# the blockwise path once rotated by tunix's default theta there, 1.03 nats off
@pytest.mark.parametrize(("block", "theta"), [(128, None), (4, None), (4, 100.0)])
def test_blockwise_log_probs_and_gradients_are_dense_attention_s(block, theta):
  config = toy_models.tiny_qwen3_config(40, num_heads=4, num_kv_heads=2)
  config = config if theta is None else _with_frequencies(config, theta)
  dense = compat.use_rope_frequencies(toy_models.make_policy(config, seed=1))
  blockwise = compat.use_rope_frequencies(toy_models.make_policy(config, seed=1))
  assert compat.use_blockwise_attention(blockwise, block) == config.num_layers
  assert compat.use_blockwise_attention(blockwise, block) == 0  # once
  prompt, completion, mask = _padded_rows(40)

  def logps(model):
    return passes.compute_per_token_logps(
      model, prompt, completion, pad_id=0, eos_id=0, attention_mask=mask, stop_gradient=False
    )

  np.testing.assert_allclose(logps(blockwise) * mask, logps(dense) * mask, atol=2e-5)

  def grads(model):
    loss = lambda m: jnp.sum(logps(m) * mask)  # noqa: E731
    return jax.tree.leaves(nnx.state(nnx.grad(loss)(model), nnx.Param))

  for got, want in zip(grads(blockwise), grads(dense), strict=True):
    np.testing.assert_allclose(got, want, atol=5e-5, rtol=1e-4)


def test_a_blockwise_run_trains_and_its_first_rollout_is_the_dense_run_s(tmp_path):
  """The sampler keeps tunix's cached path, so the first rollout is the same; the run's
  passes attend blockwise, and its first update's loss is the dense run's to float error."""
  rows = {}
  for attention in ("dense", "blockwise"):
    out = tmp_path / attention
    command = ["train", "--config", str(SMOKE), "--output-dir", str(out), "train.steps=1"]
    assert (
      cli.main([*command, f"model.attention={attention}", "model.attention_block_size=128"]) == 0
    )
    (rows[attention],) = [r for r in read_jsonl(out / "metrics.jsonl") if "actor/loss" in r]
  for key in ("train/response_length/mean", "train/episode_return/mean"):
    assert rows["blockwise"][key] == rows["dense"][key], key
  np.testing.assert_allclose(
    rows["blockwise"]["actor/loss"], rows["dense"]["actor/loss"], atol=1e-5
  )


def test_blockwise_keeps_packed_episodes_apart_as_if_each_ran_alone():
  """Two episodes packed into one row (segment ids 1 and 2, positions restarting at each,
  the row's tail padding) give each episode the logits it gets alone under tunix's dense
  attention: the masking a packed row needs, on CPU."""
  config = toy_models.tiny_qwen3_config(40, num_heads=4, num_kv_heads=2)
  dense = toy_models.make_policy(config, seed=2)
  packed = toy_models.make_policy(config, seed=2)
  compat.use_blockwise_attention(packed, 4)
  rng = np.random.default_rng(3)
  first, second = rng.integers(3, 40, 7), rng.integers(3, 40, 5)
  row = np.concatenate([first, second, np.zeros(4, np.int64)])[None]
  segments = np.array([[1] * 7 + [2] * 5 + [0] * 4])
  positions = np.array([list(range(7)) + list(range(5)) + [0] * 4])
  logits, _ = packed(row, positions, None, None, segment_ids=segments)
  for tokens, span in ((first, slice(0, 7)), (second, slice(7, 12))):
    alone = np.asarray(tokens)[None]
    steps = np.arange(alone.shape[1])[None]
    want, _ = dense(alone, steps, None, toy_models.causal_mask(1, alone.shape[1]))
    np.testing.assert_allclose(logits[:, span], want, atol=2e-5)
