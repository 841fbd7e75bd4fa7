#!/usr/bin/env bash
# The GPU checks of a session with a lent CUDA machine, in parts that each fit one 10-minute command.
#
#   bash benchmarks/gpu_session.sh tests infer train       # CUDA tests; eager inference and training tables
#   bash benchmarks/gpu_session.sh compile loss            # torch.compile rows; bf16-vs-fp32 loss curve
#   bash benchmarks/gpu_session.sh commands                # detr fit / validate, predict fp32 + bf16, explorer
#
# On a machine with the project installed (`make setup`) it uses .venv; on a bare machine whose python3
# has torch, it installs wheels carried in .whl/ (the packages that machine lacks) into /tmp/site.
# Logs go to $OUT (or /tmp/gpu_session) as PART.log.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_session}
mkdir -p "$OUT"
if [ -x .venv/bin/python ]; then
  PY=.venv/bin/python
else
  PY=python3
  if [ -d .whl ] && [ ! -e /tmp/site/.done ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      && touch /tmp/site/.done
  fi
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/benchmarks PYTHONUNBUFFERED=1
RUNS=/tmp/gpu_session_runs
RELEASE=$RUNS/detr-r50-e632da11.pth   # random values in the authors' release layout (no network here)

detr() { $PY -m detr.lightning.cli "$@"; }

step() {  # step NAME COMMAND...: run, time, and keep going on failure
  local name=$1; shift
  echo; echo "=== $name: $*"
  local start=$SECONDS
  "$@"
  echo "=== $name: exit $? in $((SECONDS - start)) s"
}

release_layout_file() {
  mkdir -p $RUNS
  $PY - "$RELEASE" <<'EOF'
import json, sys, torch
layout = json.load(open("tests/data/official_detr_state_dict_layout.json"))["resnet50"]
generator = torch.Generator().manual_seed(0)
state = {k: torch.randn(s, generator=generator) * 0.02 for k, s in layout.items()}
state.update({k: v.abs() + 1.0 for k, v in state.items() if k.endswith("running_var")})
torch.save({"model": state, "args": {}, "epoch": 499}, sys.argv[1])
EOF
}

compare_predictions() {  # the bf16 run's scores against fp32's, image by image (sorted: bf16 may reorder ties)
  $PY - "$RUNS/predict_fp32/predictions.json" "$RUNS/predict_bf16/predictions.json" <<'EOF'
import collections, json, sys
runs = []
for path in sys.argv[1:]:
    by_image = collections.defaultdict(list)
    for result in json.load(open(path)):
        by_image[result["image_id"]].append(result["score"])
    runs.append({image: sorted(scores, reverse=True) for image, scores in by_image.items()})
fp32, bf16 = runs
gaps = [abs(a - b) for image in fp32 for a, b in zip(fp32[image], bf16[image])]
print(f"{len(fp32)} images; fp32 vs bf16 sorted scores: max |difference| {max(gaps):.4f}, "
      f"mean {sum(gaps) / len(gaps):.5f}; top scores fp32 {[round(s[0], 3) for s in fp32.values()][:8]}, "
      f"bf16 {[round(s[0], 3) for s in bf16.values()][:8]}")
EOF
}

part_tests() {
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  $PY -c "import torch, torchvision, lightning; print('torch', torch.__version__, 'torchvision', torchvision.__version__, 'lightning', lightning.__version__)"
  step "CUDA tests" $PY -m pytest -q -p no:cacheprovider tests/test_cuda.py
  step "device-independent tests on this machine" $PY -m pytest -q -p no:cacheprovider -x \
    tests/test_models.py tests/test_criterion.py tests/test_matcher.py tests/test_predictor.py tests/test_checkpoints.py
}

part_infer() { step "inference, eager" timeout 300 $PY benchmarks/gpu_throughput.py --sections infer --compile off; }
part_train() { step "training, eager" timeout 420 $PY benchmarks/gpu_throughput.py --sections train --compile off; }
part_compile() {
  step "inference, compiled" timeout 280 $PY benchmarks/gpu_throughput.py --sections infer --compile on --precisions tf32,bf16
  step "training, compiled" timeout 280 $PY benchmarks/gpu_throughput.py --sections train --compile on --precisions bf16
}
part_loss() { step "loss, fp32 vs bf16" timeout 420 $PY benchmarks/gpu_throughput.py --sections loss --loss-steps 300; }

part_commands() {
  release_layout_file
  step "detr validate (authors' layout)" detr validate --config configs/detr_r50_coco.yaml --data.root data/coco-mini \
    --model.init_checkpoint "$RELEASE" --trainer.devices 1 --trainer.default_root_dir $RUNS/validate
  step "detr fit (R50, coco-mini, 300 steps)" timeout 360 $PY -m detr.lightning.cli fit --config configs/detr_r50_coco.yaml --data.root data/coco-mini \
    --model.detr.pretrained_backbone false --trainer.max_steps 300 --trainer.devices 1 \
    --trainer.check_val_every_n_epoch 4 --trainer.default_root_dir $RUNS/fit
  local trained=$RUNS/fit/checkpoints/last.ckpt
  for precision in fp32 bf16; do
    step "predict $precision" $PY tools/predict.py data/coco-mini/val2017 --checkpoint "$trained" --device cuda \
      --precision $precision --batch-size 8 --threshold 0.3 --all-queries --out $RUNS/predict_$precision
  done
  compare_predictions
  step "explorer" $PY tools/explore_attention.py data/photos/chelsea.png data/photos/000000039769.png \
    --checkpoint "$trained" --device cuda --out $RUNS/explore
  ls -la $RUNS/explore
}

for part in "$@"; do
  "part_$part" 2>&1 | tee "$OUT/$part.log"
done
echo "ALL DONE in $SECONDS s"
