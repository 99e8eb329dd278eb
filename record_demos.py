"""Record scripted-expert demonstrations from the MuJoCo tabletop suite into a local LeRobotDataset v3,
the sim episodes of trained policies (their failures included) next to existing data, or recorded action
sequences played in the sim.

python record_demos.py --config configs/record/tiny.yaml
python record_demos.py --task=reach --episodes=100 --skill_range="[0.2, 1.0]" --root=outputs/datasets/mix
python record_demos.py --task=reach --episodes=40 --policies="[outputs/zoo/a, outputs/zoo/b]" \
    --include="[outputs/datasets/mix]" --cameras="[front]" --root=outputs/datasets/mix_and_policies
python record_demos.py --task=push --episodes=400 --skill_range="[0.0, 1.0]" --cameras="[front]" \
    --terminate_on_success=false --environment_state=true --root=outputs/data/push_wm  # world-model data
python record_demos.py --task=push --episodes=400 --variants=2 --seed=1500000 --skill_range="[0.0, 1.0]" \
    --cameras="[front]" --terminate_on_success=false --environment_state=true --root=outputs/data/push_cf
    # each start pushed two ways: counterfactual pairs for the world model's counterfactual_weight
python record_demos.py --task=reach --episodes=400 --seed=5000 --skill_range="[0.2, 1.0]" \
    --include="[outputs/datasets/mix]" --root=outputs/datasets/mix_grown   # more of the same, one dataset
python record_demos.py --task=push --cameras=[front] --terminate_on_success=false --environment_state=true \
    --replay="[outputs/eval/<policy>/imagined_actions.jsonl]" --root=outputs/datasets/imagined_in_sim  # what
    # a policy's imagined actions do in the sim
python record_demos.py --task=pusht --cameras=[top] --image_size=96 --max_steps=100 --episodes=300 \
    --skill_range="[0.0, 1.0]" --root=outputs/datasets/pusht   # LeRobot's gym-pusht, a scripted pusher
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from worldloop.common.config import parse_cli
from worldloop.data.recording import policy_recording_parts, recording_part
from worldloop.sim.recording import RecordingConfig, record_demos


def main(args: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cfg = parse_cli(RecordingConfig, args)
    try:
        if cfg.policies:
            from worldloop.vla.sim_recording import record_policies

            root = record_policies(cfg)
        else:
            root = record_demos(cfg)
    except KeyboardInterrupt:
        if cfg.policies:
            where = (
                f"{policy_recording_parts(Path(cfg.root))} (a dataset per policy, not merged into {cfg.root})"
            )
        elif cfg.include:
            where = f"{recording_part(Path(cfg.root))} (not merged into {cfg.root})"
        else:
            where = cfg.root
        print(f"interrupted: {where} holds the episodes completed before Ctrl-C", file=sys.stderr)
        sys.exit(130)
    print(f"wrote {root}")


if __name__ == "__main__":
    main()
