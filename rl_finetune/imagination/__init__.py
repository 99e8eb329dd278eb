"""worldloop: rl_finetune.imagination."""
