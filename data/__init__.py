"""worldloop: data."""
