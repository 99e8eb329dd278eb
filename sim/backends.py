"""Picks the physics/rendering backend of the tabletop suite: MuJoCo (default) or Genesis (optional extra).

Both backends implement `TabletopSim`'s interface with the same scene, servo, cameras and state, so the
env, the experts, recording and the sim robot work unchanged on either.
"""

from __future__ import annotations

from worldloop.common.embodiment import TABLETOP_ARM, EmbodimentSpec

SIM_BACKENDS = ("mujoco", "genesis")


def make_tabletop_sim(
    backend: str = "mujoco",
    cameras: tuple[str, ...] = ("front", "wrist"),
    image_size: int = 64,
    embodiment: EmbodimentSpec = TABLETOP_ARM,
):
    """A `TabletopSim` (mujoco) or `GenesisTabletopSim` (genesis); genesis is imported only when asked for."""
    if backend == "mujoco":
        from worldloop.sim.tabletop_sim import TabletopSim

        return TabletopSim(cameras, image_size, embodiment)
    if backend == "genesis":
        from worldloop.sim.genesis_backend import GenesisTabletopSim

        return GenesisTabletopSim(cameras, image_size, embodiment)
    raise ValueError(f"unknown sim backend {backend!r}; expected one of {SIM_BACKENDS}")
