"""Count simulator physics steps, wherever in the process they happen.

RL in imagination must not use the simulator for training. Rather than trusting that the training code
has no simulator handle, `count_sim_steps()` wraps `TabletopSim.advance` (the one place every sim env
and the sim robot step the physics) for the duration of a block and counts the calls:

    with count_sim_steps() as counter:
        train_in_imagination(...)
    assert counter.steps == 0
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass
class SimStepCounter:
    steps: int = 0


@contextlib.contextmanager
def count_sim_steps() -> Iterator[SimStepCounter]:
    from worldloop.sim.tabletop_sim import TabletopSim

    counter = SimStepCounter()
    original = TabletopSim.advance

    def counted(self, duration: float) -> None:
        counter.steps += 1
        original(self, duration)

    TabletopSim.advance = counted
    try:
        yield counter
    finally:
        TabletopSim.advance = original
