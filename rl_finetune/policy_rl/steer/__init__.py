"""worldloop: rl_finetune.policy_rl.steer."""
