"""worldloop: common."""
