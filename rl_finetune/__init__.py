"""worldloop: rl_finetune."""
