"""Writes tunix's own PPO learner test with `PpoExtConfig`/`PpoExtLearner` swapped in.

`python .ci/swap_in.py SRC DST`: SRC is tunix's `tests/rl/ppo/ppo_learner_test.py` (of
the tunix version under test), DST the rewritten copy to run with pytest. Every
`ppo_lib.PPOConfig(` becomes `PpoExtConfig(` and every `ppo_lib.PPOLearner(` becomes
`PpoExtLearner(`, with one import line added; the script fails if either is not found,
so a changed upstream test cannot silently run stock tunix.
"""

from __future__ import annotations

import pathlib
import sys

SWAPS = {"ppo_lib.PPOConfig(": "PpoExtConfig(", "ppo_lib.PPOLearner(": "PpoExtLearner("}
IMPORT = "from tunix_ppo_ext import PpoExtConfig, PpoExtLearner\n"
ANCHOR = "from tunix.rl.ppo import ppo_learner as ppo_lib\n"


def swap_in(source: str) -> str:
  """tunix's test source with our two classes in place of tunix's."""
  for old, new in SWAPS.items():
    if old not in source:
      raise SystemExit(f"swap_in: {old!r} not found in tunix's test")
    source = source.replace(old, new)
  if ANCHOR not in source:
    raise SystemExit(f"swap_in: {ANCHOR.strip()!r} not found in tunix's test")
  return source.replace(ANCHOR, ANCHOR + IMPORT, 1)


def main(argv: list[str]) -> None:
  src, dst = (pathlib.Path(a) for a in argv)
  dst.write_text(swap_in(src.read_text()))


if __name__ == "__main__":
  main(sys.argv[1:])
