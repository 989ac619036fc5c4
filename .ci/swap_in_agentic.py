"""Writes tunix main's own agentic learner tests with `AgenticPpoLearner` swapped in.

`python .ci/swap_in_agentic.py SRC DST`: SRC is tunix main's
`tests/rl/agentic/agentic_rl_learner_test.py` or `agentic_grpo_learner_test.py` (chosen by
its file name), DST the rewritten copy to run with pytest.

- `agentic_rl_learner_test.py`: its `DummyLearner` subclasses `AgenticPpoLearner` instead of
  tunix's `AgenticRLLearner`, with a stand-in chat parser where the test gives none
  (`AgenticPpoLearner` refuses `chat_parser=None`; these tests never run an episode), and
  its configs are `AgenticPpoConfig`s.
- `agentic_grpo_learner_test.py`: every `GRPOLearner` (built, or subclassed) is
  `AgenticPpoLearner`, and every `GRPOConfig(...)` becomes the `AgenticPpoConfig` of the
  same keys (`grpo_keys_as_ppo`: the `grpo` estimator, GRPO's `beta` as the KL in the loss).

Every rewritten pattern must be found, so a changed upstream test cannot silently run stock
tunix.
"""

from __future__ import annotations

import pathlib
import sys

IMPORT = "from tunix_ppo_ext import AgenticPpoConfig, AgenticPpoLearner\n"
GRPO_KEYS = '''

def grpo_keys_as_ppo(*, loss_algo="grpo", beta=0.04, kl_loss_mode="kl", **keys):
  """tunix's `GRPOConfig` keys as an `AgenticPpoConfig`: GRPO's group advantages (`grpo`),
  its `beta` as the KL in the loss (estimator `kl_loss_mode`), the rest as they are."""
  if loss_algo != "grpo":
    raise ValueError(f"AgenticPpoLearner has no loss_algo={loss_algo!r}")
  kl = {"kl_penalty": "loss", "kl_loss_coef": beta, "kl_method": kl_loss_mode} if beta else {}
  keys.setdefault("num_generations", 2)
  return AgenticPpoConfig(advantage_estimator="grpo", beta=0.0, **kl, **keys)
'''
RULES = {
  "agentic_rl_learner_test.py": (
    "from tunix.rl.agentic import agentic_rl_learner\n",
    IMPORT,
    {
      "class DummyLearner(agentic_rl_learner.AgenticRLLearner):": (
        "class DummyLearner(AgenticPpoLearner):\n"
        "  def __init__(self, *args, chat_parser=None, **kwargs):\n"
        "    super().__init__(*args, chat_parser=chat_parser or mock.Mock(), **kwargs)\n"
      ),
      "agentic_rl_learner.AgenticRLConfig(": "AgenticPpoConfig(",
    },
  ),
  "agentic_grpo_learner_test.py": (
    "from tunix.rl.agentic import agentic_grpo_learner\n",
    IMPORT + GRPO_KEYS,
    {
      "agentic_grpo_learner.GRPOLearner(": "AgenticPpoLearner(",
      "(agentic_grpo_learner.GRPOLearner):": "(AgenticPpoLearner):",
      "agentic_grpo_learner.GRPOConfig(": "grpo_keys_as_ppo(",
    },
  ),
}


def swap_in(name: str, source: str) -> str:
  """tunix's test source `name` with `AgenticPpoLearner` in place of tunix's learner."""
  anchor, added, swaps = RULES[name]
  for old, new in swaps.items():
    if old not in source:
      raise SystemExit(f"swap_in_agentic: {old!r} not found in tunix's {name}")
    source = source.replace(old, new)
  if anchor not in source:
    raise SystemExit(f"swap_in_agentic: {anchor.strip()!r} not found in tunix's {name}")
  return source.replace(anchor, anchor + added, 1)


def main(argv: list[str]) -> None:
  src, dst = (pathlib.Path(a) for a in argv)
  dst.write_text(swap_in(src.name, src.read_text()))


if __name__ == "__main__":
  main(sys.argv[1:])
