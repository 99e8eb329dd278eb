"""worldloop: rl_finetune.wm_posttrain."""
