"""worldloop: sim."""
