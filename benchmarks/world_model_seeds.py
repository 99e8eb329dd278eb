"""Is a world-model recipe change a gain? Its fidelity figures against the recipe's, over training seeds.

    python benchmarks/world_model_seeds.py \
        '--baseline=[docs/results/a_s0.json,docs/results/a_s1.json,docs/results/a_s2.json]' \
        '--candidate=[docs/results/b_s0.json,docs/results/b_s1.json,docs/results/b_s2.json]' \
        --name=world_model_seeds_push_cn05

Each file is a `world_model_fidelity.py` result of one trained model; the i-th baseline and the i-th
candidate were trained on the same seed and scored on the same held-out windows, so they are compared in
pairs. Reported: every figure per seed, each arm's mean with its Student-t 95% interval, and the paired
differences (candidate minus baseline) with theirs. The keep rule is the protocol's, fixed before the runs:
the candidate is kept when, in every seed pair, it is better on every `keep_higher` and `keep_lower` figure,
no `max_rise` figure rose by more than its allowance (`'--max_rise={cube_error@30: 0.3}'`: a guard, not a
win to have), no `max_drop` figure fell by more than its (`'--max_drop={cube_r: 0.05}'`), and every candidate
draws frames above copy-last in SSIM and PSNR at every horizon (unless `--beat_copy_last=false`). This script
only reads results; it trains and scores nothing.

Each result's machine (the CPU model and vector extensions of the host that scored it, which in the seeds
pipeline also trained it) is reported beside it, and a pair measured on two hosts is named: fp32 training
reproduces bit for bit only on one host kind, so such a pair's difference holds the host's and the candidate's.
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

# Where the benchmarks run: a relative path in a recorded command is from here.
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._common import write_result  # noqa: E402
from worldloop.common.config import ConfigError, parse_cli  # noqa: E402
from worldloop.common.run_record import print_table  # noqa: E402
from worldloop.common.stats import mean_ci  # noqa: E402

# name -> where a fidelity result holds it: (section, key, horizon index or None)
FIGURES: dict[str, tuple[str, str, int | None]] = {
    "ssim@1": ("curves", "ssim", 0),
    "ssim@10": ("curves", "ssim", 9),
    "ssim@30": ("curves", "ssim", 29),
    "psnr@1": ("curves", "psnr", 0),
    "psnr@30": ("curves", "psnr", 29),
    "shuffled_drop@10": ("targets_issue24", "shuffled_actions_ssim_drop_h10", None),
    "idm_ratio@30": ("targets_issue24", "idm_error_ratio_h30", None),
    "cube_error@10": ("targets_issue24", "cube_error_px_h10", None),
    "cube_error@30": ("targets_issue24", "cube_error_px_h30", None),
    # the share of steps at h30 where the cube shows in the real frame and the drawn frame shows it at all: the
    # errors above average only over those
    "cube_found@30": ("targets_issue24", "cube_found_rate_h30", None),
    "cube_r": ("targets_issue24", "cube_displacement_r", None),
    "group_std": ("targets_issue24", "clip_reward_group_std", None),
    # measured since 2026-11-26 (cube_found_moving@30: 2026-11-29): older results lack them, and a comparison
    # leaves out what a file lacks
    "cube_still_error@30": ("targets_issue24", "cube_still_error_px_h30", None),
    "cube_step_slope": ("targets_issue24", "cube_one_step_slope", None),
    # since 2026-12-02: the drawn cube's pixels over the real one's on those one-step moves
    "cube_step_area": ("targets_issue24", "cube_one_step_area_ratio", None),
    # cube_found@30 over the windows where the real cube moves at least 4 px (where a lost cube costs r)
    "cube_found_moving@30": ("targets_issue24", "cube_found_rate_moving_h30", None),
    # idm_ratio@30 read by a referee IDM (world_model_fidelity --referee_idm), where the scoring had one
    "idm_ratio_referee@30": ("targets_issue24", "idm_error_ratio_h30_referee", None),
    # 1.0 where the drawn frames beat copying the last frame at every horizon 1..30, else 0.0
    "ssim_above_copy_last": ("targets_issue24", "ssim_above_copy_last_every_h", None),
    "psnr_above_copy_last": ("targets_issue24", "psnr_above_copy_last_every_h", None),
}
COPY_LAST = ["ssim_above_copy_last", "psnr_above_copy_last"]
OPTIONAL = {"cube_still_error@30", "cube_step_slope", "cube_found_moving@30", "idm_ratio_referee@30"}


@dataclass
class SeedComparisonConfig:
    baseline: list[str] = field(default_factory=list)  # fidelity JSONs, one per training seed
    candidate: list[str] = field(default_factory=list)  # the same seeds, in the same order
    keep_higher: list[str] = field(default_factory=lambda: ["ssim@30"])
    keep_lower: list[str] = field(default_factory=lambda: ["idm_ratio@30"])
    max_rise: dict[str, float] = field(default_factory=dict)  # figure -> how much higher it may be
    max_drop: dict[str, float] = field(default_factory=dict)  # figure -> how much lower it may be
    beat_copy_last: bool = True
    name: str = "world_model_seeds"
    # Validate the rule and exit, reading no result: a pipeline checks its protocol before it trains the arms
    # (pipelines.world_model_seeds). The files need not exist yet.
    check_only: bool = False

    def validate(self) -> None:
        if not self.baseline or len(self.baseline) != len(self.candidate):
            raise ConfigError(
                f"baseline and candidate need one fidelity JSON per seed each, in the same seed order; got "
                f"{len(self.baseline)} and {len(self.candidate)}"
            )
        named = [*self.keep_higher, *self.keep_lower, *self.max_rise, *self.max_drop]
        unknown = [f for f in named if f not in FIGURES]
        if unknown:
            raise ConfigError(
                f"keep_higher/keep_lower/max_rise/max_drop name unknown figures {unknown}; known: {list(FIGURES)}"
            )
        for option in ("max_rise", "max_drop"):
            negative = {f: v for f, v in getattr(self, option).items() if v < 0}
            if negative:
                raise ConfigError(f"{option} allowances must be >= 0, got {negative}")

    def rule_figures(self) -> list[str]:
        """The figures the keep rule reads: each must be measured in every result."""
        copy_last = COPY_LAST if self.beat_copy_last else []
        return [*self.keep_higher, *self.keep_lower, *self.max_rise, *self.max_drop, *copy_last]


def read_figures(path: str | Path) -> tuple[dict[str, float], tuple[int, str]]:
    """One fidelity result -> ({figure: value}, what it was scored on: the number of held-out windows and
    the dataset its command names, "" where it names none)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no such fidelity result (benchmarks/world_model_fidelity.py writes them)"
        )
    result = json.loads(path.read_text())
    figures = result.get("figures", {})
    out = {}
    for name, (section, key, index) in FIGURES.items():
        value = figures.get(section, {}).get(key)
        if value is None and name in OPTIONAL:
            continue
        if value is None:
            raise ValueError(
                f"{path}: figures.{section}.{key} is missing; expected a world_model_fidelity.py result"
            )
        out[name] = float(value[index] if index is not None else value)  # a bool becomes 1.0 / 0.0
    command = result.get("command") or ""
    roots = [a.split("=", 1)[1] for a in shlex.split(command) if a.startswith("--dataset.root=")]
    # a root given relative to the repository (where the benchmarks run) and the same root given absolute are one
    root = str((REPO / roots[-1]).resolve()) if roots else ""
    return out, (int(figures.get("windows", 0)), root)


def read_host(path: str | Path) -> str:
    """The host a result was measured on, "<cpu model> [<extensions>]"; "" where its record names none."""
    machine = json.loads(Path(path).read_text()).get("machine") or {}
    if not machine.get("cpu_model"):
        return ""
    return f"{machine['cpu_model']} [{' '.join(machine.get('cpu_extensions') or [])}]"


def compare(
    baseline: list[dict[str, float]], candidate: list[dict[str, float]], cfg: SeedComparisonConfig
) -> dict:
    """Per-arm means, paired differences and the keep decision (see the module docstring)."""
    result: dict = {"seeds": len(baseline), "figures": {}}
    runs = baseline + candidate
    missing = [n for n in cfg.rule_figures() if not all(n in run for run in runs)]
    if missing:
        raise ValueError(
            f"the keep rule's {missing} is not measured in every result (an older benchmark run)"
        )
    result["left_out"] = [n for n in FIGURES if not all(n in run for run in runs)]
    for name in (n for n in FIGURES if n not in result["left_out"]):
        b = [run[name] for run in baseline]
        c = [run[name] for run in candidate]
        diff = [y - x for x, y in zip(b, c)]
        result["figures"][name] = {
            "baseline": b,
            "candidate": c,
            "differences": diff,
            "baseline_mean": mean_ci(b),
            "candidate_mean": mean_ci(c),
            "difference": mean_ci(diff),
        }
    figures = result["figures"]
    wins = {n: [d > 0 for d in figures[n]["differences"]] for n in cfg.keep_higher}
    wins |= {n: [d < 0 for d in figures[n]["differences"]] for n in cfg.keep_lower}
    guards = {n: [d <= rise for d in figures[n]["differences"]] for n, rise in cfg.max_rise.items()}
    guards |= {n: [d >= -drop for d in figures[n]["differences"]] for n, drop in cfg.max_drop.items()}
    if cfg.beat_copy_last:
        guards |= {n: [v == 1.0 for v in figures[n]["candidate"]] for n in COPY_LAST}
    result["keep_rule"] = {
        "higher": cfg.keep_higher,
        "lower": cfg.keep_lower,
        "max_rise": cfg.max_rise,
        "max_drop": cfg.max_drop,
        "beat_copy_last": cfg.beat_copy_last,
        "wins_per_seed": wins,
        "guards_per_seed": guards,
    }
    result["kept"] = all(all(w) for w in [*wins.values(), *guards.values()])
    return result


def main() -> None:
    cfg = parse_cli(SeedComparisonConfig)
    cfg.validate()
    if cfg.check_only:
        print(f"keep rule valid: {cfg.rule_figures()} over {len(cfg.baseline)} seed pairs")
        return
    runs = {arm: [read_figures(p) for p in getattr(cfg, arm)] for arm in ("baseline", "candidate")}
    scored_on = {s for arm in runs.values() for _, s in arm}
    if len({windows for windows, _ in scored_on}) != 1:
        raise ValueError(
            f"the results were scored on different numbers of held-out windows {sorted(scored_on)}"
        )
    if len({root for _, root in scored_on}) != 1:
        files = {root or "(none named)": [] for _, root in scored_on}
        for path, (_, (_, root)) in zip(cfg.baseline + cfg.candidate, runs["baseline"] + runs["candidate"]):
            files[root or "(none named)"].append(path)
        raise ValueError(f"the results were scored on different datasets (--dataset.root): {files}")
    windows = scored_on.pop()[0]
    result = compare([f for f, _ in runs["baseline"]], [f for f, _ in runs["candidate"]], cfg)
    result |= {"baseline_files": cfg.baseline, "candidate_files": cfg.candidate, "windows": windows}
    hosts = {arm: [read_host(p) for p in getattr(cfg, arm)] for arm in ("baseline", "candidate")}
    result["hosts"] = hosts | {
        "differ_per_seed": [b != c for b, c in zip(hosts["baseline"], hosts["candidate"])]
    }
    rows = []
    for name, f in result["figures"].items():
        d = f["difference"]
        rows.append(
            {
                "figure": name,
                "baseline per seed": " ".join(f"{v:.4g}" for v in f["baseline"]),
                "candidate per seed": " ".join(f"{v:.4g}" for v in f["candidate"]),
                "mean difference": f"{d['mean']:+.4g} [{d['low']:+.4g}, {d['high']:+.4g}]",
            }
        )
    print_table(rows, title=f"candidate minus baseline over {result['seeds']} seeds (95% t interval)")
    print(
        f"kept: {result['kept']} (rule, in every seed pair: higher {cfg.keep_higher}, lower {cfg.keep_lower}, "
        f"at most this much higher {cfg.max_rise}, at most this much lower {cfg.max_drop}, above copy-last "
        f"everywhere: {cfg.beat_copy_last})"
    )
    for i, differ in enumerate(result["hosts"]["differ_per_seed"]):
        if differ:
            print(
                f"seed pair {i}: measured on different hosts (baseline {hosts['baseline'][i] or 'unrecorded'}, "
                f"candidate {hosts['candidate'][i] or 'unrecorded'}): its difference holds the host's too"
            )
    path = write_result(cfg.name, result, " ".join(shlex.quote(a) for a in ["python", *sys.argv]))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
