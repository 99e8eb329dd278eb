"""Settings of the closed loop (`finetune_policy.py --loop.rounds=N`), apart from the loop's code
(`rl_finetune.closed_loop`) so that the fine-tuning config can hold them without importing the loop."""

from __future__ import annotations

from dataclasses import dataclass, field

from worldloop.common.training import TrainLoopConfig


def _world_model_train() -> TrainLoopConfig:
    # A short fine-tune from the current weights: little warmup, no checkpoints between, no tracker.
    return TrainLoopConfig(
        steps=200, batch_size=16, lr=1e-4, warmup_steps=10, ema_decay=0.99, checkpoint_every=10_000,
        keep_checkpoints=1, log_every=20, report_to="none",
    )  # fmt: skip


@dataclass
class LoopConfig:
    # 0: fine-tune the policy once (no loop). N >= 1: N rounds of (a) run the current policy in the sim for
    # `episodes` episodes and record them, (b) add them to the world model's data, (c) fine-tune the world
    # model on the grown data, (d) fine-tune the policy in imagination in the new world model.
    rounds: int = 0
    # The world model's training data (LeRobotDataset v3). It is never modified: each round writes the
    # grown copy to <output_dir>/round_<r>/dataset.
    dataset_root: str = ""
    episodes: int = 20  # sim episodes of the current policy recorded per round (failures included)
    seed: int = 300_000  # sim seeds of the recorded episodes: seed + (r - 1) * episodes + i in round r
    terminate_on_success: bool = False  # end recorded episodes at success (match the world model's data)
    window: int = 6  # frames per world-model training window (as train_world_model.py's `window`)
    held_out_fraction: float = 0.1  # episodes the world-model fine-tune never trains on
    world_model_train: TrainLoopConfig = field(default_factory=_world_model_train)
    # Share of the world-model fine-tune's training windows drawn from the episodes the loop recorded (all
    # rounds so far), by repeating them; 0 takes windows as they come, where 100 recorded episodes are a
    # few percent of a large dataset's windows (6% of reach_heads_zoo's) in a short fine-tune.
    recorded_fraction: float = 0.0
    # Fine-tune the outcome heads alone on the grown data, the rest of the world model frozen. For heads
    # that judge from the first frame and the joint state (heads.use_frame=false) the drawn frames do not
    # matter: what the policy's own episodes teach them is its near misses, labelled by the sim.
    heads_only: bool = False
    # Then set the success threshold again from replays of the grown data's held-out episodes, the
    # policy's own among them (world_model/success_calibration.py); false keeps the model's threshold.
    calibrate_success: bool = False
    # The KL trust region of every round's policy fine-tune is to the original BC policy (true), or to
    # the policy the round starts from (false).
    kl_to_original_bc: bool = True

    def validate(self) -> None:
        if self.rounds < 0 or self.episodes < 1 or self.window < 2:
            raise ValueError(
                f"loop: need rounds >= 0, episodes >= 1, window >= 2; got {self.rounds}, {self.episodes}, "
                f"{self.window}"
            )
        if not 0.0 <= self.recorded_fraction < 1.0:
            raise ValueError(f"loop.recorded_fraction={self.recorded_fraction}: expected a share in [0, 1)")
        if self.rounds and not self.dataset_root:
            raise ValueError("loop.rounds > 0 needs loop.dataset_root: the world model's training data")
