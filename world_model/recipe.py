"""The push recipe's two phases, as `train_world_model.py` overrides of configs/world_model/tiny.yaml
(docs/training.md).

Teacher forcing first, at twice the config's learning rate (the config's 1e-3 stays for what else it trains: heads
refits, the RL setting's world model); both phases noise the context frames up to 0.75 (the config's 0.5). Then
training goes on from those weights (`--init_from`) with the model drawing the last four frames of each 8-frame
window itself, gradient through all four, so the frames that carry the loss are drawn on from up to three frames
of its own (kept over 3 seeds against two of six: docs/experiments.md, 2026-11-28); what moves in a window weighs
4 in its frame losses; the exported model reads its warp bicubically.
The quickstart, `benchmarks/gpu_session.sh` and `benchmarks/world_model_step_time.py` read it from here, so the
recipe has one definition. No imports, so the shell script reads it without loading torch.
"""

# Context frames noised up to 0.75 (tiny.yaml 0.5) in both phases: the IDM error ratio at h30 -0.26 [-0.59, +0.06],
# lower in each of 3 seeds (1.26-1.38), the cube error at h30 -0.13 px, the one-step slope +0.019 [+0.009, +0.029],
# SSIM@30 +0.011, under a rule written after seeing seed 0 (docs/experiments.md, 2026-12-07).
CONTEXT_NOISE_ARG = "--model.context_noise_max=0.75"

TEACHER_FORCING_PHASE_ARGS = (
    # Twice tiny.yaml's 1e-3 in teacher forcing, the second phase unchanged: the pushed cube's error at h30 after
    # both phases -0.49 px [-0.70, -0.29] and r +0.036, both in each of 3 seeds, SSIM@30 +0.008, the IDM ratio
    # -0.06; the cube found at h30 -0.03 (docs/experiments.md, 2026-12-03).
    "--train.lr=2.0e-3",
    CONTEXT_NOISE_ARG,
)

# 1,200 against 600 raised the drawn cube's displacement r in each of 3 seeds (docs/experiments.md, 2026-11-27).
SELF_ROLLOUT_STEPS = 1200

SELF_ROLLOUT_PHASE_ARGS = (
    "--train.lr=3.0e-4",
    "--train.warmup_steps=10",
    "--window=8",
    "--model.self_rollout_frames=4",
    "--model.self_rollout_grad_frames=4",
    # Trained reading the warp bilinearly, drawn bicubically: the pushed cube was kept in 0.88-0.98 of the windows
    # where it moves at h30, against 0.61-0.74 (3 seeds; docs/experiments.md, 2026-11-29). Trained bicubically,
    # a push model lost it more often.
    "--model.dit.warp_read=bicubic",
    "--model.dit.train_warp_read=bilinear",
    # Pixels that move anywhere in the window weigh 1 + 3 in its frame losses: the pushed cube's error at h30
    # -0.54 px [-0.62, -0.45] and displacement r +0.04, both in each of 3 fresh seeds, the IDM ratio not higher in
    # any, SSIM@30 -0.008 (docs/experiments.md, 2026-12-01). w 10 moved the cube further but lost the arm late in
    # a rollout in 2 of 6 seeds.
    "--model.motion_loss_weight=3",
    "--model.motion_loss_span=window",
    # The model's own IDM, frozen for the term, reads the drawn frames against the commanded actions (weight 0.3):
    # the IDM error ratio at h30 by a referee IDM -0.35 [-0.57, -0.13], lower in each of 3 seeds, the cube error
    # unchanged (-0.01 px), SSIM@30 -0.004 (docs/experiments.md, 2026-12-02). Weight 1 cost the cube 0.5 px.
    "--model.self_rollout_idm_weight=0.3",
    CONTEXT_NOISE_ARG,
)
