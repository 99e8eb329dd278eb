"""deploy.py's config: robot types from LeRobot's registry (plus `sim`), fuser choice, clear errors.

Each `parse_cli(DeployConfig, ...)` costs seconds (draccus reads the docstrings of every registered robot
config), so the command-line and YAML paths are tested once each.
"""

from __future__ import annotations

import pytest
from lerobot.robots import RobotConfig

from worldloop.common.config import ConfigError, parse_cli
from worldloop.common.embodiment import TABLETOP_ARM
from worldloop.real_robot.deploy import DeployConfig, deploy
from worldloop.real_robot.robots import SO101_ARM, SimRobotConfig, embodiment_for, make_robot


def test_default_robot_is_the_sim_arm():
    cfg = DeployConfig()
    assert isinstance(cfg.robot, SimRobotConfig) and cfg.robot.type == "sim"
    assert embodiment_for(cfg.robot) is TABLETOP_ARM


def test_lerobot_robot_from_the_command_line_builds_its_driver(tmp_path):
    cfg = parse_cli(
        DeployConfig,
        [
            "--robot.type=so101_follower",
            "--robot.port=/dev/does-not-exist",
            f"--robot.calibration_dir={tmp_path}",
            "--fuser.name=naive",
        ],
    )
    # LeRobot registers one config class under both names; `.type` reports the first (so100_follower).
    assert type(cfg.robot).__name__ == "SOFollowerRobotConfig"
    assert cfg.robot.type in ("so100_follower", "so101_follower")
    assert cfg.robot.port == "/dev/does-not-exist" and cfg.fuser.name == "naive"
    assert embodiment_for(cfg.robot) is SO101_ARM
    try:
        robot = make_robot(cfg.robot, control_hz=100)
    except ModuleNotFoundError as e:  # the Feetech SDK is an optional LeRobot extra, absent here
        assert "install the matching LeRobot extra" in str(e) and "lerobot[feetech]" in str(e)
        return
    assert type(robot).__name__ in ("SO100Follower", "SO101Follower") and not robot.is_connected
    with pytest.raises(Exception, match="does-not-exist"):
        robot.connect(calibrate=False)


@pytest.mark.slow  # another ~10 s draccus parse; the command-line test covers the same registry path
def test_yaml_selects_the_robot_type(tmp_path):
    path = tmp_path / "deploy.yaml"
    path.write_text("robot:\n  type: sim\n  task: reach\nruntime:\n  control_hz: 200\n")
    cfg = parse_cli(DeployConfig, ["--config", str(path)])
    assert cfg.robot.task == "reach" and cfg.runtime.control_hz == 200


def test_unknown_robot_type_in_yaml_names_the_file_and_choices(tmp_path):
    path = tmp_path / "deploy.yaml"
    path.write_text("robot:\n  type: so999\n")
    with pytest.raises(ConfigError, match=r"deploy.yaml: robot.type='so999' is not one of .*so101_follower"):
        parse_cli(DeployConfig, ["--config", str(path)])


def test_robot_type_without_an_embodiment_is_a_clear_error():
    koch = RobotConfig.get_choice_class("koch_follower")(port="/dev/null")
    with pytest.raises(ValueError, match="robot.type='koch_follower': no embodiment spec"):
        deploy(DeployConfig(robot=koch))


def test_missing_policy_path_is_a_clear_error():
    with pytest.raises(ValueError, match="policy_path: a pretrained policy directory is required"):
        deploy(DeployConfig())
