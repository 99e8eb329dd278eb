"""worldloop: robot learning with a world model in the loop.

The repository's top-level folders (`world_model/`, `vla/`, `rl_finetune/`, ...) install as the subpackages
of this one namespace (`import worldloop.world_model`), so nothing but `worldloop` lands at the top of
`site-packages` (see `[tool.setuptools] package-dir` in pyproject.toml).
"""

__version__ = "0.1.0"
