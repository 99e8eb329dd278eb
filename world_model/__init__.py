"""worldloop: world_model."""
