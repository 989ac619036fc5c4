"""`model.attention`: tunix's splash attention switched on for the families that have it,
refused in one line naming the key everywhere it cannot run (another family, a row that is
not whole blocks, a backend or compiler other than the TPU's)."""

from __future__ import annotations

import pytest
from flax import nnx
from tunix.models.llama3 import model as llama3_model

from tests.conftest import SMOKE
from tunix_ppo_ext._src.checks import ConfigError
from tunix_ppo_ext._src.run import cli, job, plan
from tunix_ppo_ext._src.run.run_config import load_resolved
from tunix_ppo_ext._src.tunix.models import hf_models
from tunix_ppo_ext._src.tunix.models import toy_models as models

ROWS = ["train.max_prompt_length=64", "env.max_completion_len=64"]  # 128 tokens a row


def test_splash_sets_tunix_s_flash_flag_and_block_on_qwen3_and_keeps_dense_as_it_was():
  config = models.tiny_qwen3_config(16)
  assert hf_models.with_attention(config, "dense", 512) is config
  splash = hf_models.configured(config, "block", "splash", 256)
  assert splash.use_flash_attention and splash.flash_attention_block_size == 256
  assert splash.remat_config.name == "BLOCK" and not config.use_flash_attention


def test_a_family_without_splash_is_refused_naming_the_key():
  config = llama3_model.ModelConfig.llama3p2_1b()
  with pytest.raises(ConfigError, match=r"'model.attention'='splash': tunix's llama3 model"):
    hf_models.with_attention(config, "splash", 512)


@pytest.mark.parametrize(
  ("overrides", "message"),
  [
    (["model.attention=flash"], r"'model.attention' 'flash' unknown; did you mean 'splash'"),
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
  sampler = cluster.rollout._sampler  # noqa: SLF001 (what the sampler merges)
  flags = [
    module.config.use_flash_attention
    for _, module in nnx.iter_graph(
      nnx.merge(sampler._transformer_graphdef, nnx.state(sampler.transformer))
    )  # noqa: SLF001
    if hasattr(getattr(module, "config", None), "use_flash_attention")
  ]
  assert flags and not any(flags)
  cluster.close()
