"""Post-train a world model with rewards: rollout stability and/or inverse-dynamics executability.

    python posttrain_world_model.py --config configs/posttrain/tiny.yaml \
        --world_model.path=outputs/world_model/tiny/pretrained_model --dataset.root=outputs/data/tabletop
    ... --stages='[stability]'        # one stage alone; the default runs stability, then executability
    ... --resume=true                 # continue the unfinished stage exactly from its last checkpoint
    accelerate launch --num_processes 2 posttrain_world_model.py --config configs/posttrain/tiny.yaml ...
"""

from __future__ import annotations

from worldloop.common.config import parse_cli
from worldloop.rl_finetune.wm_posttrain.posttrain import PosttrainConfig, run_posttraining


def main() -> None:
    final = run_posttraining(parse_cli(PosttrainConfig))
    print(f"post-trained world model: {final}")


if __name__ == "__main__":
    main()
