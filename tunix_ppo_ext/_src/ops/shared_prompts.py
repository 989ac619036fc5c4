"""Prompts shared by several rows: the `G` episodes of a GRPO group start from one prompt.

A training pass over `[B, P + T]` rows runs every row's prompt, though the rows of a group
hold the same one. Run once per distinct prompt instead, its keys and values handed to
each of its rows' completions (as a KV cache; Prefix Grouper, Liu et al. 2025, "Efficient
GRPO Training through Shared-Prefix Forward"), a pass runs `U x P + B x T` token positions
instead of `B x (P + T)`, with the same outputs: a prompt's positions attend to the prompt
only, so they are the same in every row that holds it.

`plan_shared_prompts` runs on the host (NumPy) once per batch: which distinct prompt each
row holds, within each chunk of rows (the micro-batches a pass or an update sees).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tunix_ppo_ext._src.ops.buckets import bucket

__all__ = ["plan_shared_prompts"]


def plan_shared_prompts(
  prompts: np.ndarray, chunks: Sequence[int] | None = None, multiple: int = 1
) -> np.ndarray | None:
  """`[B, U]` int8 one-hot: the distinct prompt (within its chunk of rows) that each row of
  `prompts` `[B, P]` holds, or None when sharing saves nothing.

  `U`, the columns, is the most distinct prompts of any chunk, rounded up to a bucket
  (`buckets.bucket`: few shapes to compile) and to a multiple of `multiple` (e.g. the
  data-parallel devices, which split the prompts' rows); None when that is not fewer than
  the rows of the smallest chunk, or the prompts have no columns. A column no row holds
  is a copy: it runs, unused.

  Args:
    prompts: `[B, P]` token ids; rows with equal ids (padding included) share.
    chunks: consecutive row counts summing to `B` (default: one chunk).
    multiple: see above.
  """
  prompts = np.asarray(prompts)
  batch = prompts.shape[0]
  chunks = [batch] if chunks is None else [int(c) for c in chunks]
  if sum(chunks) != batch or min(chunks, default=1) < 1 or multiple < 1:
    raise ValueError(f"shared prompts: chunks {chunks} do not split {batch} rows")
  held, start = [], 0
  for size in chunks:
    _, inverse = np.unique(prompts[start : start + size], axis=0, return_inverse=True)
    held.append(inverse.reshape(-1))
    start += size
  most = max(int(h.max()) + 1 for h in held)
  columns = -(-bucket(most) // multiple) * multiple
  if columns >= min(chunks) or prompts.shape[1] == 0:
    return None
  return np.eye(columns, dtype=np.int8)[np.concatenate(held)]
