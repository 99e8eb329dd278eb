"""The push recipe's second phase, as `train_world_model.py` overrides (docs/training.md).

After teacher forcing, training goes on from those weights (`--init_from`) with the model drawing the last two
frames of each 6-frame window itself, gradient through both. The quickstart and `benchmarks/gpu_session.sh`
run it from here, so the recipe has one definition. No imports, so the shell script reads it without loading
torch.
"""

SELF_ROLLOUT_PHASE_ARGS = (
    "--train.lr=3.0e-4",
    "--train.warmup_steps=10",
    "--window=6",
    "--model.self_rollout_frames=2",
    "--model.self_rollout_grad_frames=2",
)
