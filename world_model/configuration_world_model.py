"""Configuration of the world model (`WorldModel`): its parts' configs and the training levers, each with
why it exists. Every field is a key of a world-model config file (configs/world_model/*.yaml, `model:`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from worldloop.world_model import flow
from worldloop.world_model.codec import AutoencoderConfig
from worldloop.world_model.dit import VideoDiTConfig
from worldloop.world_model.heads import OutcomeHeadsConfig
from worldloop.world_model.idm import InverseDynamicsConfig
from worldloop.world_model.sampler import SamplerConfig


@dataclass
class WorldModelConfig:
    dit: VideoDiTConfig = field(default_factory=VideoDiTConfig)
    idm: InverseDynamicsConfig = field(default_factory=InverseDynamicsConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)  # the default rollout sampler
    heads: OutcomeHeadsConfig = field(default_factory=OutcomeHeadsConfig)  # reward / success / done
    autoencoder: AutoencoderConfig = field(
        default_factory=AutoencoderConfig
    )  # latent space when a path is set
    cameras: tuple[str, ...] = ("front",)
    parameterisation: str = "x0"  # x0 | velocity | edm (x0 was the one that worked on CPU)
    sigma_data: float = 0.5  # for edm preconditioning, frames in [-1, 1]
    noise_distribution: str = "uniform"  # uniform | logit_normal, for the frame being generated
    # Training noise levels are drawn in [noise_floor, 1]. A 1-2 step sampler only ever asks for t = 1 and
    # t = 0.5, where the answer must come from context and action rather than from the noisy frame itself;
    # a floor spends the training budget there.
    noise_floor: float = 0.0
    # Context frames carry a little noise in training (noise level ~ U(0, max)) so the model learns not to
    # trust its own slightly-wrong past frames; rollouts noise their context at `context_noise_rollout`.
    context_noise_max: float = 0.1
    context_noise_rollout: float = 0.02
    # With dit.previous_frames > 1 in training, the older frames the pixel paths read carry the newest one's
    # context noise (not their own): their difference is then the last step's motion, noise-free. With each
    # frame's own noise, push models read the older frame to average noise away and drew the cube moving
    # backwards one step ahead (slope -0.3, docs/experiments.md 2026-11-26). Rollouts need
    # context_noise_rollout 0 (they read clean frames, where both coincide).
    previous_frames_share_noise: bool = False
    # With dit.residual_to_previous_frame in training, the residual (and the warp) start from the previous frame
    # without its context noise (the real frame, or self-forcing's own estimate of it); the patch input and
    # the output convolution still read it noised. With context_noise_rollout 0 a rollout's previous frame is
    # noise-free anyway: trained on the noised one, the residual learns to rescale and denoise a frame that
    # is never noisy where it is used, and in a rollout it smooths clean frames (push: drawn cubes blurred).
    noise_free_residual_base: bool = False
    # Share of training windows whose context frames 1..T-1 are replaced by the model's own estimates of them
    # (one no-grad teacher-forced pass, noise levels where a few-step sampler works). Teacher forcing alone
    # never shows the model its own errors, so in a rollout they pile up frame after frame; with its own
    # estimates as context it learns to repair them. Costs one extra forward pass per step.
    self_forcing: float = 0.0
    # Self-rollout (`self_rollout_frames` = k > 0): the last k frames of every training window are also drawn
    # by the model itself, one after another from the real frames before them, as a rollout draws them
    # (the rollout sampler from fresh noise, its own frames as context, the KV-cache path), and their error
    # against the real frames (MSE of the encoded frames) is added with weight `self_rollout_weight`. The last
    # `self_rollout_grad_frames` of the k carry gradient, through the sampler and through being context of
    # the frames after them; the earlier ones are drawn without (time and memory stay bounded). Teacher
    # forcing never sees a rollout drift; this loss does, and backpropagates through it.
    self_rollout_frames: int = 0
    self_rollout_grad_frames: int = 1
    self_rollout_weight: float = 1.0
    # > 0: the model's own inverse dynamics model, frozen for this term, reads each pair of self-rollout frames
    # that carries gradient (with the frame before the first) and its error against the commanded actions
    # (MSE, normalised actions) is added with this weight: the drawn motion is pushed toward one that shows
    # its action, not only toward the real frame's pixels, whose loss barely notices an arm drawn a pixel
    # short. Pixel frames only (no autoencoder: the gradient goes through the drawn pixels). Score such a
    # model's action following with an IDM it did not train against (world_model_fidelity --referee_idm).
    self_rollout_idm_weight: float = 0.0
    # Counterfactual pairs (`counterfactual_weight` = w > 0, with self_rollout_frames): every training batch is
    # pairs of windows from one start at one frame offset that the data pushes two ways (recorded with
    # record_demos.py --variants; data/windows.py CounterfactualPairs), the first window of each pair in the
    # batch's first half, its partner in the second. Both are self-rolled out from the same sampler noise, and
    # w x the MSE of the drawn difference between the two (the frames that carry gradient) against the real
    # difference is added. With the noise shared the drawn difference comes from the actions alone. Against the
    # per-window loss it weighs the error the two windows do not share (a drawing that pulls a start's outcomes
    # together) twice and the error they share not at all. `train.batch_size` then counts pairs (a step reads
    # twice as many windows); the rollout context must be noise-free (context_noise_rollout 0).
    counterfactual_weight: float = 0.0
    # Motion-weighted frame losses (`motion_loss_weight` = w > 0): the pixels of a target frame that differ
    # from the real frame before it (by more than `motion_threshold` in some channel of the encoded frame,
    # grown by one pixel each way) weigh 1 + w in the diffusion and self-rollout losses, the rest 1; each
    # loss is divided by its mean weight, so w moves emphasis, not the learning rate. Where what moves is
    # small (gym-pusht's agent is ~16 of 4,096 pixels at 64x64) the plain MSE is nearly all static
    # background, and a model that leaves the mover out, ignoring the actions, loses almost nothing.
    motion_loss_weight: float = 0.0
    motion_threshold: float = 0.1
    # frame | window. `window`: a pixel that moves between any two frames of the training window weighs
    # 1 + w in every target frame of it. With `frame` a pushed object weighs more only in the frames where
    # it moves, and the push model, leaning on the arm, lost the resting cube in the others.
    motion_loss_span: str = "frame"
    # Auxiliary object-state loss (`object_state_weight` = w > 0; datasets that record
    # `observation.environment_state`, e.g. the sim's cube positions): a linear head on the last block's
    # tokens of each target frame regresses that frame's recorded object state and its change since the
    # frame before, added to the loss with weight w (Huber). Each is centred and divided by one scale for all
    # its dimensions (the root mean square of their stds): the values share units (the sim's metres), and a
    # per-dimension scale blew a resting cube's millimetre jitter in height up to unit-sized noise, which the
    # head cannot predict and whose gradient held back the frames (experiments: the aborted runs). A pushed
    # cube is a few dozen of 4,096 pixels and the pixel loss barely notices it drawn a pixel off; this makes
    # the tokens that draw a frame carry where its objects are and how they move, from the context and the
    # action, also at high noise. Training only: rollouts never read the head, and nothing but the frames
    # is drawn. `object_state_dim` (E) is set by training from the dataset.
    object_state_weight: float = 0.0
    object_state_dim: int = 0
    action_dropout: float = 0.0  # > 0 trains the unconditional model for classifier-free guidance
    head_loss_weight: float = 0.1
    idm_loss_weight: float = 1.0
    # How the training dataset's frames were brought to the model's size (DatasetConfig.resize: "", crop,
    # stretch); set by training, read by every later stage that opens a dataset for this model.
    dataset_resize: str = ""

    @property
    def frame_size(self) -> int:
        """The side of the square frames the model reads and draws (pixels, before any autoencoder)."""
        return self.autoencoder.image_size if self.autoencoder.path else self.dit.image_size

    def validate(self) -> None:
        self.dit.validate()
        self.sampler.validate()
        self.heads.validate()
        if self.parameterisation not in flow.PARAMETERISATIONS:
            raise ValueError(
                f"parameterisation={self.parameterisation!r}; expected one of {flow.PARAMETERISATIONS}"
            )
        if self.previous_frames_share_noise and self.dit.previous_frames < 2:
            raise ValueError(
                "previous_frames_share_noise needs dit.previous_frames >= 2 (older frames to share it)"
            )
        if self.previous_frames_share_noise and self.context_noise_rollout > 0:
            raise ValueError(
                f"previous_frames_share_noise trains on older frames that share the newest one's noise; rollouts "
                f"noise each frame on its own, so it needs context_noise_rollout=0, got {self.context_noise_rollout}"
            )
        if self.noise_free_residual_base and not self.dit.residual_to_previous_frame:
            raise ValueError("noise_free_residual_base needs dit.residual_to_previous_frame")
        if self.dit.residual_to_previous_frame and self.parameterisation != "x0":
            raise ValueError(
                f"dit.residual_to_previous_frame adds the previous frame to an x0 prediction; "
                f"parameterisation={self.parameterisation!r} needs dit.residual_to_previous_frame=false"
            )
        if len(self.cameras) != self.dit.num_views:
            raise ValueError(
                f"cameras={list(self.cameras)} but dit.num_views={self.dit.num_views}; they must match"
            )
        if self.idm.action_dim != self.dit.action_dim:
            raise ValueError(
                f"idm.action_dim={self.idm.action_dim} differs from dit.action_dim={self.dit.action_dim}"
            )
        if not 0 <= self.context_noise_rollout <= 1 or not 0 <= self.context_noise_max <= 1:
            raise ValueError("context_noise_max and context_noise_rollout must lie in [0, 1]")
        if not 0 <= self.noise_floor < 1:
            raise ValueError(f"noise_floor={self.noise_floor} must lie in [0, 1)")
        if not 0 <= self.self_forcing <= 1:
            raise ValueError(f"self_forcing={self.self_forcing} must lie in [0, 1]")
        if self.self_rollout_frames < 0 or self.self_rollout_weight < 0:
            raise ValueError(
                f"self_rollout_frames={self.self_rollout_frames} and self_rollout_weight="
                f"{self.self_rollout_weight} must be >= 0"
            )
        if self.counterfactual_weight < 0:
            raise ValueError(f"counterfactual_weight={self.counterfactual_weight} must be >= 0")
        if self.counterfactual_weight > 0 and not self.self_rollout_frames:
            raise ValueError(
                f"counterfactual_weight={self.counterfactual_weight} compares self-rolled-out pairs: it needs "
                "self_rollout_frames > 0"
            )
        if self.counterfactual_weight > 0 and self.context_noise_rollout > 0:
            raise ValueError(
                f"counterfactual_weight={self.counterfactual_weight} draws a pair from the same noise, but "
                f"context_noise_rollout={self.context_noise_rollout} noises each window's context on its own: "
                "set context_noise_rollout=0 (as configs/world_model/tiny.yaml)"
            )
        if self.self_rollout_idm_weight < 0:
            raise ValueError(f"self_rollout_idm_weight={self.self_rollout_idm_weight} must be >= 0")
        if self.self_rollout_idm_weight > 0 and (
            not self.self_rollout_frames or self.autoencoder.path or self.idm.use_state
        ):
            raise ValueError(
                f"self_rollout_idm_weight={self.self_rollout_idm_weight} reads the self-rollout's drawn pixels "
                "with the IDM: it needs self_rollout_frames > 0, no autoencoder.path and idm.use_state=false"
            )
        if self.self_rollout_frames and not 1 <= self.self_rollout_grad_frames <= self.self_rollout_frames:
            raise ValueError(
                f"self_rollout_grad_frames={self.self_rollout_grad_frames} must lie in "
                f"[1, self_rollout_frames={self.self_rollout_frames}]"
            )
        if self.motion_loss_weight < 0 or self.motion_threshold < 0:
            raise ValueError(
                f"motion_loss_weight={self.motion_loss_weight} and motion_threshold={self.motion_threshold} "
                "must be >= 0"
            )
        if self.object_state_weight < 0 or (self.object_state_weight > 0 and self.object_state_dim < 1):
            raise ValueError(
                f"object_state_weight={self.object_state_weight} must be >= 0, and > 0 needs object_state_dim "
                f"(the size of observation.environment_state) >= 1, got {self.object_state_dim}"
            )
        if self.motion_loss_span not in ("frame", "window"):
            raise ValueError(f"motion_loss_span={self.motion_loss_span!r} must be 'frame' or 'window'")
        if not 0 <= self.action_dropout < 1:
            raise ValueError(f"action_dropout={self.action_dropout} must lie in [0, 1)")
