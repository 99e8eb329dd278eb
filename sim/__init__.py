"""worldloop: sim — the MuJoCo tabletop suite, scripted experts, the sim robot, and the episode loop that
records an actor in it (`sim.recording`).

Importing `sim` selects a headless OpenGL backend (before MuJoCo loads) and registers the gymnasium envs
`worldloop/TabletopReach-v0` and `worldloop/TabletopPush-v0`.
"""

from worldloop.sim.rendering import select_gl_backend

select_gl_backend()

import gymnasium as gym  # noqa: E402

ENV_IDS = {"reach": "worldloop/TabletopReach-v0", "push": "worldloop/TabletopPush-v0"}

for _task, _env_id in ENV_IDS.items():
    if _env_id not in gym.registry:
        gym.register(id=_env_id, entry_point="worldloop.sim.tabletop_env:TabletopEnv", kwargs={"task": _task})
