#!/bin/bash
cd /work/main
for lr in 1e-4 1e-3; do
  .venv/bin/tunix-ppo-ext train --config configs/smollm2.yaml ppo.advantage_estimator=gae 'model.lora={rank: 8, alpha: 16, critic: true}' model.value_head_init=zero ppo.critic_warmup_steps=12 train.steps=12 train.critic_lr=$lr ppo.critic_lambda=1.0 output_dir=/tmp/probe/lr$lr train.eval_every=100 train.checkpoint_every=100 > /tmp/probe/lr$lr.log 2>&1
done
