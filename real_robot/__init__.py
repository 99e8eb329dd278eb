"""worldloop: real_robot."""
