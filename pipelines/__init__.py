"""worldloop: pipelines."""
