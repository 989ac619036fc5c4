"""One episode of an environment under a policy function."""

from __future__ import annotations


def play(env, seed, policy):
  """Runs one episode; returns (observations, rewards, infos)."""
  observation, _ = env.reset(seed=seed)
  observations, rewards, infos = [observation], [], []
  terminated = truncated = False
  while not (terminated or truncated):
    observation, reward, terminated, truncated, info = env.step(policy(env, observation))
    observations.append(observation)
    rewards.append(reward)
    infos.append(info)
  return observations, rewards, infos
