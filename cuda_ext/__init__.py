"""worldloop: cuda_ext."""
