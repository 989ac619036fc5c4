"""Multi-turn rollouts: episodes of text environments through tunix's rollout engine.

`MultiTurnRollout` plays episodes turn by turn and hands `PpoExtLearner` token-exact
trajectories (attention mask = every real token, loss mask = agent tokens only).
"""

from tunix_ppo_ext._src.data.char_tokenizer import CharTokenizer
from tunix_ppo_ext._src.tunix.rollout.agentic_envs import TunixEnv
from tunix_ppo_ext._src.tunix.rollout.multi_turn import Mode, MultiTurnRollout

__all__ = ["CharTokenizer", "Mode", "MultiTurnRollout", "TunixEnv"]
