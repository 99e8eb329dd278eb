"""The simulator behind `WorldModelEnv`'s batched interface: RL's ceiling, with a perfect world model and judge.

RL in imagination mixes three limits: the RL recipe (algorithm, iterations, rollouts), the world model's drawn
future and the judge's verdict on it. `SimRolloutEnv` removes the last two: its episodes are the simulator's
own, from the same reset seeds as the starts imagination would draw from, scored by the simulator's success
and progress. Fine-tuning with `--rollouts=sim` trains on them, so its gain is what the recipe itself can
reach. It steps the physics, so it is a diagnostic: its runs report their training sim steps and are never a
figure of RL in imagination.

The interface is the part of `WorldModelEnv` that policy RL reads (`reset`, `step`, `done`, `succeeded`,
`progress`, `success_threshold`, `cameras`, `device`, `config`); observations have its batch format at the
world model's frame size, so the policy sees what it sees in imagination, only real.
"""

from __future__ import annotations

import torch

from worldloop.vla.sim_evaluation import SimEvalConfig, policy_batch
from worldloop.world_model.world_model_env import InitialStates, WorldModelEnvConfig


class SimRolloutEnv:
    """B simulator episodes stepped together, reset from the seeds of their `InitialStates`."""

    def __init__(
        self,
        sim_cfg: SimEvalConfig,
        config: WorldModelEnvConfig,
        cameras: tuple[str, ...],
        image_size: int,
        device: str | torch.device = "cpu",
    ):
        if sim_cfg.max_steps != config.horizon:
            raise ValueError(
                f"sim max_steps={sim_cfg.max_steps} differs from env.horizon={config.horizon}: simulated "
                "training episodes must last as long as imagined ones"
            )
        self.sim_cfg, self.config = sim_cfg, config
        self.cameras, self.image_size = tuple(cameras), image_size
        self.device = torch.device(device)
        self.success_threshold = 0.5  # the sim's verdict is 0 or 1
        self._envs: list = []
        self.steps_taken = 0

    def _grow(self, n: int) -> None:
        """At least n envs, made once and reused across resets (each holds a renderer)."""
        import gymnasium as gym

        from worldloop import sim  # registers the envs

        # The episode ends at the horizon here, not by the env, and success ends it only as configured.
        env_cfg = self.sim_cfg.env_config(self.image_size, self.cameras, self.config.terminate_on_success)
        while len(self._envs) < n:
            self._envs.append(gym.make(sim.ENV_IDS[self.sim_cfg.task], config=env_cfg))

    def close(self) -> None:
        for env in self._envs:
            env.close()
        self._envs = []

    def reset(self, initial: InitialStates, seed: int = 0) -> dict:
        """Reset one simulator episode per start, with the start's reset seed (`seed` is not used: the
        physics is deterministic given the seeds and the actions)."""
        if initial.seeds is None:
            raise ValueError(
                "rollouts in the simulator need starts rendered from sim resets (their seeds): "
                "use starts.source=sim"
            )
        b = initial.batch_size
        self._grow(b)
        observations, tasks = [], []
        for env, s in zip(self._envs[:b], initial.seeds):
            obs, info = env.reset(seed=int(s))
            observations.append(obs)
            tasks.append(info["task"])
        self._task = tasks
        self._last = observations
        self.succeeded = torch.zeros(b, dtype=torch.bool, device=self.device)
        self.progress = torch.zeros(b, device=self.device)
        self.steps_taken = 0
        return self._observation()

    def _observation(self) -> dict:
        return policy_batch(self._last, self._task, self.cameras, self.device)

    @torch.no_grad()
    def step(self, action_chunk: torch.Tensor) -> tuple[dict, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        """Play `action_chunk` [B, K, A] (absolute joint targets) in every live episode, cut at the horizon;
        an episode that has ended (success with terminate_on_success) is not stepped. Returns (obs, reward
        [B] (the progress gained), terminated [B], truncated [B], info with the running `progress`)."""
        b = self.succeeded.shape[0]
        if action_chunk.dim() != 3 or action_chunk.shape[0] != b:
            raise ValueError(f"action_chunk: expected [{b}, K, A], got {list(action_chunk.shape)}")
        remaining = self.config.horizon - self.steps_taken
        if remaining <= 0:
            raise RuntimeError(
                f"the episode ended at the horizon ({self.config.horizon} steps); call reset()"
            )
        chunk = action_chunk[:, :remaining].float().cpu().numpy()
        before = self.progress.clone()
        live = (~self.done).tolist()
        for i, env in enumerate(self._envs[:b]):
            for k in range(chunk.shape[1]):
                if not live[i]:
                    break
                obs, _, _, _, info = env.step(chunk[i, k])
                self._last[i] = obs
                self.progress[i] = float(info["progress"])
                if info["success"]:
                    self.succeeded[i] = True
                    if self.config.terminate_on_success:
                        live[i] = False
        self.progress = torch.where(self.succeeded, torch.ones_like(self.progress), self.progress)
        self.steps_taken += chunk.shape[1]
        truncated = torch.full((b,), self.steps_taken >= self.config.horizon, device=self.device)
        info = {"progress": self.progress.clone()}
        return self._observation(), self.progress - before, self.succeeded.clone(), truncated, info

    def success_prob(self, info: dict, task: list[str]) -> torch.Tensor:
        raise NotImplementedError(
            "rollouts in the simulator have no judge to ask about other instructions: set algorithm.hindsight=false"
        )

    @property
    def done(self) -> torch.Tensor:
        """[B] episodes that ended (success with terminate_on_success, or the horizon)."""
        over = self.steps_taken >= self.config.horizon
        ended = self.succeeded if self.config.terminate_on_success else torch.zeros_like(self.succeeded)
        return ended | over
