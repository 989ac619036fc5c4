"""Models and clusters: meshes, toy and Hugging Face policies, critics, LoRA, export.

`build_cluster` builds tunix's real `RLCluster` (mesh, trainer and rollout configs) for a
policy, a reference, a critic and a tokenizer from a `ClusterSpec` (a run's is
`ResolvedRun.cluster`); `load_checkpoint` reads a Hugging Face
checkpoint of any supported family through tunix's own loaders (in `dtype`, as
`model.dtype`); `cast_params` and `train_in_float32` hold a model's frozen weights in
bfloat16 and what it trains in float32.
"""

from tunix_ppo_ext._src.config.cluster_spec import ClusterSpec
from tunix_ppo_ext._src.optim.guards import guarded_adam
from tunix_ppo_ext._src.optim.optimizers import OptimizerSpec, build_optimizer
from tunix_ppo_ext._src.tunix.cluster.cluster_setup import build_cluster, make_models
from tunix_ppo_ext._src.tunix.cluster.mesh import make_mesh, role_meshes
from tunix_ppo_ext._src.tunix.models.hf_export import save_hf_checkpoint
from tunix_ppo_ext._src.tunix.models.hf_models import (
  cast_params,
  load_checkpoint,
  read_hf_config,
  train_in_float32,
)
from tunix_ppo_ext._src.tunix.models.lora import LoraSpec, apply_lora, merged
from tunix_ppo_ext._src.tunix.models.toy_models import (
  ValueModel,
  critic_from_policy,
  make_critic,
  make_policy,
  tiny_qwen3_config,
)

__all__ = [
  "ClusterSpec",
  "LoraSpec",
  "OptimizerSpec",
  "ValueModel",
  "apply_lora",
  "build_cluster",
  "build_optimizer",
  "cast_params",
  "critic_from_policy",
  "guarded_adam",
  "load_checkpoint",
  "make_critic",
  "make_mesh",
  "make_models",
  "make_policy",
  "merged",
  "read_hf_config",
  "role_meshes",
  "save_hf_checkpoint",
  "tiny_qwen3_config",
  "train_in_float32",
]
