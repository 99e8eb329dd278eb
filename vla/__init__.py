"""worldloop: vla."""
