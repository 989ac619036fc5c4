"""`ModelSpec`: how the run builds its models, the run config's `model.remat`,
`model.attention`, `model.attention_block_size` and `model.dtype` in one frozen value.

The run config works it out once (`ResolvedRun.model`) and the builders take it whole
(`hf_models.configured`, `hf_models.load_model`, the job's and plan's model builders).
Each field is checked beside its declaration, in `__post_init__`, with one `ConfigError`
line naming the run config's key.
"""

from __future__ import annotations

import dataclasses

from tunix_ppo_ext._src.checks import check_choice, check_integer

REMAT_CHOICES = ("none", "block", "decoder")  # tunix's RematConfig members, lower case
ATTENTION_CHOICES = ("dense", "splash", "blockwise")
DTYPE_NAMES = ("bfloat16", "float32")  # `model.dtype`'s choices (None: the checkpoint's)
MIN_BLOCK_SIZE = 128  # the smallest `model.attention_block_size`


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """The model settings every builder takes (see `RunConfig.model`'s docstring).

  `remat`: tunix's activation rematerialisation (`REMAT_CHOICES`); `attention`: the
  training passes' attention (`ATTENTION_CHOICES`); `block_size`: splash's or blockwise's
  block, in tokens; `dtype`: the frozen weights' dtype (`DTYPE_NAMES`; None: as stored).
  """

  remat: str = "none"
  attention: str = "dense"
  block_size: int = 512
  dtype: str | None = None

  def __post_init__(self):
    check_choice("config key 'model.remat'", self.remat, REMAT_CHOICES)
    check_choice("config key 'model.attention'", self.attention, ATTENTION_CHOICES)
    check_integer("config key 'model.attention_block_size'", self.block_size, MIN_BLOCK_SIZE)
    if self.dtype is not None:
      check_choice("config key 'model.dtype'", self.dtype, DTYPE_NAMES)
