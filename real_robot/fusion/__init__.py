"""Chunk fusers: how action chunks from an asynchronous policy become one command per control tick."""

from __future__ import annotations

from dataclasses import dataclass

from worldloop.real_robot.fusion.base import Chunk, ChunkFuser, KinematicState
from worldloop.real_robot.fusion.naive import NaiveFuser
from worldloop.real_robot.fusion.rail import RailFuser
from worldloop.real_robot.fusion.rtc import RTCFuser
from worldloop.real_robot.fusion.temporal_ensemble import TemporalEnsembleFuser
from worldloop.real_robot.fusion.weighted_average import WeightedAverageFuser

FUSERS = ("naive", "temporal_ensemble", "weighted_average", "rail", "rtc")


@dataclass
class FuserConfig:
    name: str = "rail"  # naive | temporal_ensemble | weighted_average | rail | rtc
    ensemble_coeff: float = 0.01  # temporal_ensemble: weight exp(-coeff * i), i = 0 for the oldest chunk
    old_weight: float = 0.3  # weighted_average: share of the executing plan where chunks overlap
    smoother_degree: int = 3  # rail: polynomial degree fitted to each chunk
    blend_min_s: float = 0.1  # rail: shortest blend into a new chunk
    blend_max_s: float = 0.8  # rail: longest blend (used when limits allow no shorter one)


def make_fuser(cfg: FuserConfig, spec, control_dt: float) -> ChunkFuser:
    if cfg.name == "naive":
        return NaiveFuser(spec, control_dt)
    if cfg.name == "temporal_ensemble":
        return TemporalEnsembleFuser(spec, control_dt, coeff=cfg.ensemble_coeff)
    if cfg.name == "weighted_average":
        return WeightedAverageFuser(spec, control_dt, old_weight=cfg.old_weight)
    if cfg.name == "rail":
        return RailFuser(spec, control_dt, cfg.smoother_degree, cfg.blend_min_s, cfg.blend_max_s)
    if cfg.name == "rtc":
        return RTCFuser(spec, control_dt)
    raise ValueError(f"fuser.name: unknown fuser {cfg.name!r}; expected one of {', '.join(FUSERS)}")


__all__ = ["FUSERS", "Chunk", "ChunkFuser", "FuserConfig", "KinematicState", "make_fuser"]
