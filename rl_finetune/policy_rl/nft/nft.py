"""DiffusionNFT for a flow-matching VLA inside the world model (--algorithm.type=nft).

GRPO and PPO score a chunk by the log-probability of its whole denoising chain. That is sharp: a
Gaussian step over a 40-number chunk (10 actions x 4 joints) at the sampler's std 0.15 changes its
log-probability by several nats when the mean moves by a few hundredths, so a few gradient steps push the
per-step ratios past any clip and most samples stop teaching. NFT needs no likelihood at all: it is
supervised flow matching on the policy's own imagined chunks, weighted by how good they were
(rl_finetune/nft.py has the objective and what it reduces to).

One iteration:
1. Collect (as GRPO): each of N imagined initial states is repeated G times; the sampling ("old") policy
   acts with its stochastic sampler and the world model imagines what follows. No simulator is involved.
2. Score: an episode's return is `success_reward * success + progress_reward * progress` from the world
   model's heads; the G returns of a start become optimality probabilities r in [0, 1] (group-normalised,
   r = 1/2 for a group whose returns are all equal); every chunk of an episode gets its episode's r.
3. Update: each chunk a (normalised actions) is noised on the policy's flow path, x_s = (1 - s) a + s n
   at noise level s ~ U[t_min, t_max] (the policy's own time is 1 - s), and with the velocities of the
   trained, old and BC policies at x_s, `nft_loss` pulls the implicit positive policy towards the chunks
   with r > 1/2 and the negative one towards the rest; the target is the flow-matching velocity a - n.
   Its regulariser keeps the policy near BC (the trust region that stops it drifting into states where the
   world model is wrong). After the update the old policy follows softly:
   old <- old_decay * old + (1 - old_decay) * policy.

With every r = 1 and beta = 1 this is the BC loss on the policy's own chunks (rejection-sampling
fine-tuning); with every r = 1/2 the policy does not move.

Hindsight (`algorithm.hindsight`). A policy that fails the same way from a start every time (reaching the red
cube when asked for the blue one) gives its group nothing to compare, and no exploration noise within its
own distribution turns that into a success (benchmarks/results/policy_failure_modes.json). But the episode
did achieve something: it reached the red cube. The success head reads the instruction, so the same
imagined frames and states are judged again under every other instruction of the start states, and an
episode that failed its own but achieved another is learnt a second time, relabelled with that
instruction and r = 1 (its decisions up to the success), as hindsight experience replay relabels goals.
This is possible because NFT needs no likelihood of the sampler that drew the chunk: the chunks were drawn
under another instruction. With `weights="success"` only successes are learnt (r = 1) and failures are
left at r = 1/2: with hindsight, goal-conditioned supervised learning in imagination.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import torch

from worldloop.common.ema import follow
from worldloop.data.features import TASK
from worldloop.rl_finetune.nft import nft_loss, optimality_probability
from worldloop.rl_finetune.policy_rl.flow_policy_gradient import (
    FlowPolicyTrainer,
    ImaginedChunks,
    Rollouts,
    flatten,
    imagine_chunks,
)
from worldloop.rl_finetune.policy_rl.nft.configuration_nft import PolicyNFTConfig
from worldloop.world_model.world_model_env import InitialStates, WorldModelEnv


class PolicyNFTTrainer(FlowPolicyTrainer):
    """NFT: collection as GRPO (by the old policy), the update of the module docstring."""

    algorithm = "NFT"

    def __init__(self, policy, env: WorldModelEnv, cfg: PolicyNFTConfig, seed: int = 0):
        super().__init__(policy, env, cfg, seed)
        self.old = copy.deepcopy(policy).eval().requires_grad_(False)
        self.instructions: list[str] = []  # every instruction of the start states so far (hindsight)
        self.relabelled = 0.0  # share of the last iteration's episodes learnt again under another one

    def collect(self, starts: InitialStates, seed: int) -> Rollouts:
        cfg = self.cfg
        if cfg.hindsight:
            self.instructions = sorted(set(self.instructions) | set(starts.task))
        chunks = imagine_chunks(
            self.old,
            self.env,
            starts.repeat(cfg.group_size),
            seed,
            self.sampler(self.old),
            cfg,
            self.instructions if cfg.hindsight else None,
        )
        if cfg.weights == "success":
            r = 0.5 + 0.5 * chunks.success
        else:
            r = optimality_probability(chunks.returns.view(-1, cfg.group_size), cfg.advantage_clip).flatten()
        data = flatten(chunks, [r] * len(chunks.chains))  # `advantages` holds r here
        if not cfg.hindsight:
            return data
        return data.with_decisions(self._relabelled(chunks))

    def _relabelled(self, chunks: ImaginedChunks) -> list[Rollouts]:
        """The decisions of episodes that failed their own instruction but achieved another, up to that
        success, relabelled with it and r = 1 (one Rollouts per instruction that has any)."""
        own = chunks.observations[0][TASK]
        b = len(own)
        failed = chunks.success == 0
        picked = torch.zeros_like(failed)
        out = []
        for i, instruction in enumerate(self.instructions):
            until = chunks.hindsight[:, i]
            other = torch.tensor([t != instruction for t in own], device=failed.device)
            pick = failed & other & (until >= 0) & ~picked  # an episode is relabelled once
            if not pick.any():
                continue
            picked |= pick
            relabelled = replace(
                chunks,
                observations=[{**o, TASK: [instruction] * b} for o in chunks.observations],
                live=[live & pick & (d <= until) for d, live in enumerate(chunks.live)],
            )
            out.append(flatten(relabelled, [torch.ones(b, device=failed.device)] * len(chunks.chains)))
        self.relabelled = picked.float().mean().item()
        return out

    def step(self, starts: InitialStates) -> dict[str, float]:
        logs = super().step(starts)
        if self.cfg.hindsight:
            logs["hindsight/relabelled"] = self.relabelled
        return logs

    def _velocity(self, model, batch: dict, x: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        return model.velocity_fn(model.encode_observation(batch))(x, time)

    def update(self, data: Rollouts, seed: int) -> dict[str, float]:
        cfg, policy = self.cfg, self.policy
        policy.train()
        generator = torch.Generator().manual_seed(seed)
        logs: dict[str, float] = {}
        n_steps = 0
        for _ in range(cfg.epochs):
            order = torch.randperm(len(data), generator=generator)
            for first in range(0, len(data), cfg.minibatch_size):
                index = order[first : first + cfg.minibatch_size]
                batch, chunk = data.batch(index), data.chain[index, -1]
                noise = torch.randn(chunk.shape, generator=generator).to(chunk)
                level = cfg.t_min + (cfg.t_max - cfg.t_min) * torch.rand(len(index), generator=generator)
                level = level.to(chunk)
                x = (1 - level[:, None, None]) * chunk + level[:, None, None] * noise
                time = 1 - level  # the policy's convention: 0 is noise, 1 is the chunk
                v_theta = self._velocity(policy, batch, x, time)
                with torch.no_grad():
                    v_old = self._velocity(self.old, batch, x, time)
                    v_ref = self._velocity(self.reference, batch, x, time)
                loss, step_logs = nft_loss(v_theta, v_old, v_ref, chunk - noise, data.advantages[index], cfg)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
                self.optimizer.step()
                for key, value in step_logs.items():
                    logs[key] = logs.get(key, 0.0) + value
                n_steps += 1
        policy.eval()
        follow(self.old, policy, cfg.old_decay)
        logs = {key: value / max(n_steps, 1) for key, value in logs.items()}
        logs["gradient_steps"] = n_steps
        return logs

    def state_dict(self) -> dict:
        return {**super().state_dict(), "old": self.old.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.old.load_state_dict(state["old"])
