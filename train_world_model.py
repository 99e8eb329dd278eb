"""Train the action-conditioned video diffusion world model.

python train_world_model.py --config configs/world_model/tiny.yaml --dataset.root=outputs/data/tabletop
accelerate launch --num_processes 2 train_world_model.py --config configs/world_model/tiny.yaml ...
... --resume=true   # continue exactly from the last checkpoint in output_dir
"""

from __future__ import annotations

from worldloop.common.config import parse_cli
from worldloop.world_model.trainer import TrainWorldModelConfig, train


def main() -> None:
    train(parse_cli(TrainWorldModelConfig))


if __name__ == "__main__":
    main()
