"""Behaviour-clone a policy (FlowVLA, or LeRobot ACT / Diffusion) on a local LeRobotDataset.

python train_policy.py --config configs/policy/tiny.yaml --dataset.root=outputs/datasets/reach_expert_200
python train_policy.py --config configs/policy/act_tiny.yaml --dataset.root=... --train.steps=3000
accelerate launch train_policy.py --config configs/policy/base.yaml ...       # several processes / GPUs
python train_policy.py --config ... --resume=true                             # continue the last checkpoint
"""

from __future__ import annotations

import logging
import os

from worldloop.common.config import parse_cli
from worldloop.vla.bc_training import TrainPolicyConfig, train_policy


def main(args: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    cfg = parse_cli(TrainPolicyConfig, args)
    train_policy(cfg)
    print(f"wrote {cfg.output_dir}/pretrained_model")


if __name__ == "__main__":
    main()
