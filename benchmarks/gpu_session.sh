#!/usr/bin/env bash
# What a session with a lent GPU runs (docs/kernels.md), stage by stage:
#
#   bash benchmarks/gpu_session.sh wheels            # HERE (the developer machine, with PyPI): fetch the
#                                                    # wheels the device image lacks into .whl/
#                                                    # (git-ignored: it travels only when carried)
#   bash benchmarks/gpu_session.sh tests bench       # ON THE DEVICE (carry .whl): pytest -m gpu, then the
#                                                    # kernel / training / imagination benchmark
#   bash benchmarks/gpu_session.sh train             # ON THE DEVICE (carry .whl): 200 base.yaml steps
#   bash benchmarks/gpu_session.sh world_model       # ON THE DEVICE (carry .whl and the dataset): the push
#                                                    # recipe's two training commands (docs/training.md)
#
# No stage named: tests, bench, train in turn (world_model only when named). Logs and JSONs go to $OUT (the
# device tool brings them back) or outputs/gpu_session; copy kernels.json and kernels_train_run.json from there
# into benchmarks/results/.
# SMOKE=1 runs bench, train and world_model at small shapes (any machine; how this script is tested on a CPU).
# LIMIT_TESTS / LIMIT_BENCH / LIMIT_TRAIN=<seconds> stop a stage there (one device call holds all three);
# kernels.py writes its JSON after every section, so a stopped bench keeps the sections it finished.
# TRAIN_RUN_STEPS (default 200) sets the train stage's length.
# world_model: WM_DATA (a LeRobotDataset root, default outputs/data/push_wm; carry it), WM_SEED (0),
# WM_TF_STEPS (tiny.yaml's), WM_SR_STEPS (world_model/recipe.py's), WM_ARGS (more overrides for both commands),
# WM_SR_ARGS (for the second only, after the recipe's: the last of a repeated key wins), LIMIT_WORLD_MODEL,
# WM_OUTPUT_DIR (where the two training runs write, default outputs/gpu_session).
# The trained model comes back as $OUT/world_model_s<seed>.tar, the first phase's as world_model_s<seed>_tf.tar
# (~11 MB each): `tar -xf` them into outputs/world_model/<name>.
# PYTHON=... picks the interpreter (default python3, the one holding PyTorch on the device).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
out=${OUT:-outputs/gpu_session}
stages=${*:-tests bench train}
# Packages the device image ('cuda') does not have, that worldloop imports on these paths: the config
# parser (draccus and its needs) and the SSIM metric. Versions as in the project's own environment.
WHEELS="draccus==0.10.0 mergedeep==1.3.4 pyyaml-include==1.4.1 toml==0.10.2 pytorch-msssim==1.0.0"
# Training a world model also reads a LeRobotDataset: lerobot and the needs the image lacks (~8 MB in all).
WHEELS="$WHEELS lerobot==0.4.4 datasets==4.8.5 dill==0.4.1 multiprocess==0.70.19 huggingface_hub==0.35.3
  fsspec==2026.2.0 zstandard==0.25.0"

if [[ " $stages " == *" wheels "* ]]; then
  $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl $WHEELS || exit 1
  ls .whl
  stages=${stages//wheels/}
  [[ -z "${stages// /}" ]] && exit 0
fi

mkdir -p "$out"
# The repository root is the package `worldloop`: importable through a link, nothing installed.
pkg=$(mktemp -d)
ln -s "$PWD" "$pkg/worldloop"
export PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G ".whl/*.whl" >/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
$PY -c "import worldloop.world_model.trainer, worldloop.common.config" \
  || { echo "worldloop does not import: run 'bash benchmarks/gpu_session.sh wheels' here and carry .whl"; exit 1; }
$PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.cuda.is_available() and torch.cuda.get_device_name(0))"
smoke=()
[[ "${SMOKE:-0}" == 1 ]] && smoke=(--smoke=true)

failed=()
for stage in $stages; do
  start=$SECONDS
  status=0
  case $stage in
    tests)  # kernels and attention backends against the fp32 references on CUDA (skipped without one)
      timeout -k 10 "${LIMIT_TESTS:-0}" $PY -m pytest -m gpu tests/test_cuda_ext_gpu.py -q -p no:cacheprovider -o addopts="" 2>&1 \
        | tee "$out/pytest_gpu.log" || status=$? ;;
    bench)  # every section but the long training run: one process, ratios in the same process
      timeout -k 10 "${LIMIT_BENCH:-0}" $PY benchmarks/kernels.py "${smoke[@]}" --sections='[attention,decode,elementwise,train,imagine]' \
        --out="$out/kernels.json" 2>&1 | tee "$out/kernels.log" || status=$? ;;
    train)  # base.yaml through the shared training loop on generated data (3 steps with SMOKE=1)
      timeout -k 10 "${LIMIT_TRAIN:-0}" $PY benchmarks/kernels.py "${smoke[@]}" --sections='[train_run]' \
        --train_run_steps="${TRAIN_RUN_STEPS:-200}" \
        --out="$out/kernels_train_run.json" 2>&1 | tee "$out/kernels_train_run.log" || status=$? ;;
    world_model)  # the push recipe: teacher forcing, then self-rollout from its weights (2 + 2 steps with SMOKE=1)
      data=${WM_DATA:-outputs/data/push_wm}
      [[ -f "$data/meta/info.json" ]] || { echo "world_model: no LeRobotDataset at WM_DATA=$data (carry it)"; exit 2; }
      # lerobot imports PyAV at module level; its 40 MB wheel would not fit the 64 MiB that travels, and datasets
      # holding images (ours: images in parquet) never call it, so where it is missing an empty module stands in.
      if ! $PY -c "import av" 2>/dev/null; then
        mkdir -p "$pkg/av" && echo "from . import logging" >"$pkg/av/__init__.py" && echo "WARNING = 30" >"$pkg/av/logging.py"
      fi
      seed=${WM_SEED:-0}; dir=${WM_OUTPUT_DIR:-outputs/gpu_session}/world_model_s$seed; log="$out/world_model_s$seed.log"
      tf_steps=${WM_TF_STEPS:+--train.steps=$WM_TF_STEPS}; sr_steps=--train.steps=${WM_SR_STEPS:-$($PY -c 'from worldloop.world_model.recipe import SELF_ROLLOUT_STEPS as n; print(n)')}
      [[ "${SMOKE:-0}" == 1 ]] && tf_steps=--train.steps=2 sr_steps=--train.steps=2
      common=(--config configs/world_model/tiny.yaml --dataset.root="$data" --train.seed="$seed"
              --eval.max_windows=0 --train.report_to=none)
      limit=${LIMIT_WORLD_MODEL:-0}
      # WM_ARGS after the recipe's first-phase overrides, so that they win there
      read -ra teacher_forcing <<<"$($PY -c 'from worldloop.world_model.recipe import TEACHER_FORCING_PHASE_ARGS as a; print(*a)')"
      timeout -k 10 "$limit" $PY train_world_model.py "${common[@]}" "${teacher_forcing[@]}" ${WM_ARGS:-} \
        $tf_steps --output_dir="${dir}_tf" 2>&1 \
        | tee "$log" || status=$?
      # the first phase's model comes back too: a second phase stopped at the limit can be run again from it
      ((status == 0)) && { tar -C "${dir}_tf" -cf "$out/world_model_s${seed}_tf.tar" pretrained_model || status=$?; }
      # the second phase gets what is left of the limit (0: none)
      ((limit > 0)) && limit=$((limit - (SECONDS - start))) && ((limit < 1)) && limit=1
      read -ra self_rollout <<<"$($PY -c 'from worldloop.world_model.recipe import SELF_ROLLOUT_PHASE_ARGS as a; print(*a)')"
      ((status == 0)) && { timeout -k 10 "$limit" $PY train_world_model.py "${common[@]}" ${WM_ARGS:-} $sr_steps "${self_rollout[@]}" \
        ${WM_SR_ARGS:-} --output_dir="${dir}_sr" --init_from="${dir}_tf/pretrained_model" 2>&1 | tee -a "$log" || status=$?; }
      ((status == 0)) && { tar -C "${dir}_sr" -cf "$out/world_model_s$seed.tar" pretrained_model || status=$?; } ;;
    *) echo "unknown stage '$stage': expected wheels, tests, bench, train, world_model"; exit 2 ;;
  esac
  echo "stage $stage: exit $status after $((SECONDS - start)) s"
  ((status == 0)) || failed+=("$stage")
done
# a failing stage does not stop the next one (each measures something else), but the exit status tells
((${#failed[@]} == 0)) || { echo "failed stages: ${failed[*]}"; exit 1; }
