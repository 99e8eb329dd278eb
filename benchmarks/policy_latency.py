"""Inference latency per action chunk at batch 1 on this CPU: FlowVLA at each sampler step count (plain,
stochastic with log-probs, RTC-guided), and LeRobot ACT / Diffusion adapters for comparison.

python benchmarks/policy_latency.py                      # tiny configs, random weights (latency only)
python benchmarks/policy_latency.py --threads=2 --repeats=50

Weights do not change the arithmetic, so untrained policies built from the configs are timed.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks._common import write_result  # noqa: E402
from worldloop.common.config import parse_cli  # noqa: E402
from worldloop.common.run_record import print_table  # noqa: E402
from worldloop.data.features import ACTION, STATE, TASK, image_key  # noqa: E402
from worldloop.data.stats import compute_stats  # noqa: E402
from worldloop.vla.bc_training import TrainPolicyConfig  # noqa: E402
from worldloop.vla.factory import make_policy  # noqa: E402


@dataclass
class LatencyConfig:
    flow_vla_config: str = "configs/policy/tiny.yaml"
    adapter_configs: list[str] = field(
        default_factory=lambda: ["configs/policy/act_tiny.yaml", "configs/policy/diffusion_tiny.yaml"]
    )
    sampler_steps: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    repeats: int = 30
    warmup: int = 3
    threads: int = 1


def _policy(config_path: str):
    train_cfg = parse_cli(TrainPolicyConfig, ["--config", config_path])
    pcfg = train_cfg.policy.selected()
    rng = np.random.default_rng(0)
    stats = {
        STATE: compute_stats(rng.normal(size=(100, pcfg.state_dim))),
        ACTION: compute_stats(rng.normal(size=(100, pcfg.action_dim))),
    }
    torch.manual_seed(0)
    return make_policy(train_cfg.policy.type, pcfg, stats).eval()


def _batch(policy) -> dict:
    h, w = policy.config.image_size
    batch = {image_key(c): torch.rand(1, 3, h, w) for c in policy.config.cameras}
    batch[STATE] = torch.randn(1, policy.config.state_dim)
    batch[TASK] = ["reach the red cube"]
    return batch


def _time_ms(fn, repeats: int, warmup: int) -> dict:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return {
        "median_ms": round(statistics.median(times), 2),
        "p90_ms": round(times[int(0.9 * (len(times) - 1))], 2),
    }


def main() -> None:
    cfg = parse_cli(LatencyConfig)
    torch.set_num_threads(cfg.threads)
    rows = []
    flow = _policy(cfg.flow_vla_config)
    batch = _batch(flow)
    prefix = flow.predict_action_chunk(batch)[:, flow.n_action_steps :]
    with torch.no_grad():
        rows.append(
            {
                "policy": "flow_vla",
                "mode": "encode observation only",
                "steps": 0,
                **_time_ms(lambda: flow.encode_observation(batch), cfg.repeats, cfg.warmup),
            }
        )
    for k in cfg.sampler_steps:
        modes = {
            "deterministic (Euler)": lambda k=k: flow.predict_action_chunk(batch, num_steps=k),
            "stochastic + log-probs": lambda k=k: flow.sample_stochastic(batch, num_steps=k),
            "RTC prefix guidance": lambda k=k: flow.predict_action_chunk_with_prefix(
                batch, prefix, 2, num_steps=k
            ),
        }
        for mode, fn in modes.items():
            rows.append(
                {"policy": "flow_vla", "mode": mode, "steps": k, **_time_ms(fn, cfg.repeats, cfg.warmup)}
            )
    for path in cfg.adapter_configs:
        policy = _policy(path)
        steps = getattr(policy.config, "num_inference_steps", 1)
        adapter_batch = _batch(policy)
        fn = lambda p=policy, b=adapter_batch: p.predict_action_chunk(b)  # noqa: E731
        rows.append(
            {
                "policy": policy.name,
                "mode": "predict_action_chunk",
                "steps": steps,
                **_time_ms(fn, cfg.repeats, cfg.warmup),
            }
        )
    print_table(
        rows, f"latency per chunk, batch 1, {cfg.threads} thread(s), load avg {os.getloadavg()[0]:.1f}"
    )
    figures = {
        "threads": cfg.threads,
        "load_average_1min_at_end": os.getloadavg()[0],
        "flow_vla_config": cfg.flow_vla_config,
        "rows": rows,
    }
    print(f"wrote {write_result('policy_latency', figures)}")


if __name__ == "__main__":
    main()
