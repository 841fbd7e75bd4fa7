#!/usr/bin/env bash
# The GPU session: every check of the CUDA path and every GPU measurement, in parts that each fit one
# 10-minute command of a lent machine (about 12 minutes in all on an H100 / H200).
#
#   bash benchmarks/gpu_session.sh --prepare               # here, before the first call: .whl/ and .authors/detr
#   bash benchmarks/gpu_session.sh tests train infer       # on the GPU: CUDA tests; training and inference tables
#   bash benchmarks/gpu_session.sh loss commands compile   # fp32/bf16/authors loss; detr fit/validate/predict; compile
#   bash benchmarks/gpu_session.sh rt_tests rt_train rt_infer rt_fit   # the real-time families: tests, tables, fit
#   bash benchmarks/gpu_session.sh rt_gate rt_compile                  # their accuracy gate; compiled rows
#   bash benchmarks/gpu_session.sh --rehearse all realtime # the same commands on the CPU at tiny sizes (CI runs it)
#
# Parts: tests, sdpa, train, infer, loss, commands, compile ('all' = each in that order; compile_infer and
# compile_train are compile's two halves); the real-time families' (benchmarks/realtime_gpu.py): rt_tests,
# rt_train, rt_infer, rt_fit, rt_gate, rt_compile ('realtime' = each in that order). On an H200 they take two
# commands: `rt_tests rt_train rt_infer rt_fit` (at most 510 s) and `rt_gate rt_compile` (at most 340 s).
# Each writes its log
# (with its table) to $OUT/PART.log (OUT defaults to /tmp/gpu_session); a step that fails is reported
# ("=== NAME: exit N") and the part goes on. The last line is "ALL DONE in S s, F failed steps".
#
# What a bare GPU machine lacks travels with the call (device tool: carry [".whl", ".authors"]):
#   .whl/           the wheels of the Python packages its image does not have (--prepare downloads them)
#   .authors/detr   a checkout of facebookresearch/detr, whose training step is timed beside ours
#                   (--prepare copies it from AUTHORS_SOURCE, a clone or a git directory of that repository;
#                   without it the authors' rows are left out and the tables say so)
#   .gpu/*.pt       trained shapes models (optional) that rt_gate gates beside the ones rt_fit trains: detr fit of
#                   configs/*_shapes_cpu.yaml, written small (fp16 weights) by
#                   tests/fixtures/make_tracking_model.py CKPT --out .gpu/NAME.pt
#                   (.git/info/exclude: /.gpu/; the working tree that travels is at most 64 MiB; CARRIED=DIR
#                   names another folder)
# On a machine with the project installed (`make setup`) it uses .venv; else python3 with the wheels
# installed into /tmp/site.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_session}
REHEARSE=0
# The packages the device image lacks (benchmarks/README: the GPU session); versions = what `make setup` installs.
WHEELS="albumentations==2.0.8 albucore==0.0.24 stringzilla==5.3.2 simsimd==6.5.16 pydantic==2.14.4
pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0
pycocotools==2.0.11 jsonargparse==4.53.0 docstring-parser==0.18.0 typeshed-client==2.15.0 importlib-resources==7.1.0
rfdetr==1.8.0 pyDeprecate==0.13.0"
# (rfdetr and pyDeprecate: the authors' RF-DETR package, timed beside ours by rt_train; not a project dependency)

prepare() {
  mkdir -p .whl
  # shellcheck disable=SC2086
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl $WHEELS || return 1
  if [ -n "${AUTHORS_SOURCE:-}" ]; then
    rm -rf .authors/detr && mkdir -p .authors/detr
    git --git-dir="$( [ -d "$AUTHORS_SOURCE/.git" ] && echo "$AUTHORS_SOURCE/.git" || echo "$AUTHORS_SOURCE")" \
      archive HEAD models util LICENSE | tar -x -C .authors/detr || return 1
  fi
  du -sh .whl .authors 2>/dev/null
}

parts=()
for arg in "$@"; do
  case $arg in
    --prepare) prepare; exit $? ;;
    --rehearse) REHEARSE=1 ;;
    all) parts+=(tests sdpa train infer loss commands compile) ;;
    realtime) parts+=(rt_tests rt_train rt_infer rt_fit rt_gate rt_compile) ;;
    *) parts+=("$arg") ;;
  esac
done
mkdir -p "$OUT"

if [ -n "${PYTHON:-}" ]; then
  PY=$PYTHON   # another interpreter (e.g. a venv with the device's torch, to rehearse under its versions)
elif [ -x .venv/bin/python ]; then
  PY=$PWD/.venv/bin/python
else
  PY=python3
  if [ -d .whl ] && [ ! -e /tmp/site/.done ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      && touch /tmp/site/.done
  fi
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
RUNS=${RUNS:-/tmp/gpu_session_runs}
rm -rf "$RUNS" && mkdir -p "$RUNS"
RELEASE=$RUNS/detr-r50-e632da11.pth   # random values in the authors' release layout (no network there)

# Sizes: the authors' on the GPU; tiny ones on the CPU for the rehearsal (the same commands otherwise).
if [ $REHEARSE = 1 ]; then
  DEVICE=cpu
  BENCH=(--device cpu --quick --compile-backend eager)
  LOSS_STEPS=3
  FIT_STEPS=4
  TINY_MODEL=(--model.detr.backbone resnet18 --model.detr.hidden_dim 32 --model.detr.num_heads 2
              --model.detr.num_encoder_layers 1 --model.detr.num_decoder_layers 2 --model.detr.dim_feedforward 64)
  SMALL_DATA=(--data.train_scales '[128]' --data.train_max_size 192 --data.crop_resize_scales '[128]'
              --data.crop_min_size 96 --data.crop_max_size 128 --data.eval_min_size 128 --data.eval_max_size 192
              --data.num_workers 0)
  PREDICT_SIZE=(--min-size 128 --max-size 192)
  LIMIT_VAL=(--trainer.limit_val_batches 2)
  # the real-time families: one model beside transformers and one of ours alone (the GPU runs every one)
  RT=(--quick --device cpu --compile-backend eager --models rtdetr_r18 --ours-only deimv2_l)
  RT_FIT_STEPS=2
  RT_FIT_FAMILIES=${RT_FIT_FAMILIES:-rtdetr}
  SHAPES=$RUNS/shapes
  SHAPES_SIZE=(--num-train 8 --num-val 4)
  GATE_IMAGES=3
else
  DEVICE=cuda
  BENCH=()
  LOSS_STEPS=${LOSS_STEPS:-200}
  FIT_STEPS=300
  TINY_MODEL=()
  SMALL_DATA=(--data.num_workers 8)
  PREDICT_SIZE=()
  LIMIT_VAL=()
  RT=()
  RT_FIT_STEPS=${RT_FIT_STEPS:-60}
  RT_FIT_FAMILIES=${RT_FIT_FAMILIES:-rtdetr rfdetr}
  SHAPES=data/shapes   # the set the carried .gpu models were trained and validated on (detr-make-shapes' default)
  SHAPES_SIZE=()
  GATE_IMAGES=${GATE_IMAGES:-100}
fi
FAILED=0

step() {  # step NAME COMMAND...: run, time, and keep going on failure
  local name=$1; shift
  echo; echo "=== $name: $*"
  local start=$SECONDS
  "$@"
  local status=$?
  echo "=== $name: exit $status in $((SECONDS - start)) s"
  [ $status = 0 ] || FAILED=$((FAILED + 1))
}

detr() { $PY -m detr.lightning.cli "$@"; }

release_layout_file() {  # random values in the authors' R50 release layout: what `detr validate` reads
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
print(f"| predict fp32 vs bf16 | {len(fp32)} images | sorted scores: max difference {max(gaps):.4f}, "
      f"mean {sum(gaps) / len(gaps):.5f} |")
EOF
}

part_tests() {
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  $PY -c "import torch, torchvision, lightning, albumentations; print('torch', torch.__version__, 'torchvision', \
torchvision.__version__, 'lightning', lightning.__version__, 'albumentations', albumentations.__version__, \
'cuda', torch.cuda.is_available())"
  step "CUDA tests" $PY -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py
  step "model, loss and matcher tests on this machine's torch" $PY -m pytest -q -p no:cacheprovider -x \
    tests/models/test_detr.py tests/loss/test_criterion.py tests/loss/test_matcher.py
}

part_sdpa() { step "bf16 training with and without cuDNN attention" timeout 300 $PY benchmarks/gpu_throughput.py \
  "${BENCH[@]}" --sections sdpa; }
part_train() {
  step "training, eager" timeout 420 $PY benchmarks/gpu_throughput.py "${BENCH[@]}" --sections train --compile off \
    --precisions "${TRAIN_PRECISIONS:-fp32,tf32,bf16}"
}
part_infer() { step "inference, eager" timeout 300 $PY benchmarks/gpu_throughput.py "${BENCH[@]}" --sections infer --compile off; }
part_loss() {
  step "loss: ours fp32, ours bf16, authors fp32" timeout 420 $PY benchmarks/gpu_throughput.py "${BENCH[@]}" \
    --sections loss --loss-steps $LOSS_STEPS
}
part_compile_infer() {
  step "inference, compiled" timeout 240 $PY benchmarks/gpu_throughput.py "${BENCH[@]}" --sections infer --compile on \
    --precisions bf16 --infer-batches 1,32
}
part_compile_train() {
  # The compile of the training step with dynamic shapes took more than 240 s on an H200 (torch 2.11).
  step "training, compiled" timeout 420 $PY benchmarks/gpu_throughput.py "${BENCH[@]}" --sections train --compile on \
    --precisions bf16 --authors ''
}
part_compile() { part_compile_infer; part_compile_train; }

part_commands() {
  release_layout_file
  step "detr validate (authors' release layout)" detr validate --config configs/detr_r50_coco.yaml \
    --data.root data/coco-mini --model.init_checkpoint "$RELEASE" --trainer.accelerator $DEVICE --trainer.devices 1 \
    "${SMALL_DATA[@]}" "${LIMIT_VAL[@]}" --trainer.default_root_dir "$RUNS/validate"
  step "detr fit (R50 bf16-mixed, coco-mini, $FIT_STEPS steps)" timeout 360 $PY -m detr.lightning.cli fit \
    --config configs/detr_r50_coco.yaml --data.root data/coco-mini --model.detr.pretrained_backbone false \
    "${TINY_MODEL[@]}" "${SMALL_DATA[@]}" "${LIMIT_VAL[@]}" --trainer.precision bf16-mixed \
    --trainer.max_steps $FIT_STEPS --trainer.accelerator $DEVICE --trainer.devices 1 \
    --trainer.check_val_every_n_epoch 4 --trainer.default_root_dir "$RUNS/fit"
  local trained=$RUNS/fit/checkpoints/last.ckpt
  [ -f "$RUNS/fit/metrics.csv" ] && tail -n 3 "$RUNS/fit/metrics.csv"
  for precision in fp32 bf16; do
    step "predict $precision" $PY tools/predict.py data/coco-mini/val2017 --checkpoint "$trained" --device $DEVICE \
      --precision $precision --batch-size 8 --threshold 0.3 --all-queries --no-draw "${PREDICT_SIZE[@]}" \
      --out "$RUNS/predict_$precision"
  done
  step "compare predictions" compare_predictions
  step "explorer" $PY tools/explore.py data/photos/chelsea.png data/photos/000000039769.png \
    --checkpoint "$trained" --device $DEVICE "${PREDICT_SIZE[@]}" --out "$RUNS/explore"
  ls -la "$RUNS/explore"
}

# The real-time families (benchmarks/realtime_gpu.py). Each step's timeout keeps each of the two commands the
# header names within its limit; the rehearsal's are long (a busy CI machine), its sizes tiny.
limit() { if [ $REHEARSE = 1 ]; then echo 1500; else echo "$1"; fi; }
part_rt_tests() {
  step "CUDA tests, every family" timeout $(limit ${RT_TESTS_S:-90}) $PY -m pytest -q -p no:cacheprovider -rs \
    tests/test_cuda.py tests/test_cuda_families.py
}
part_rt_train() {
  local package=()  # the rfdetr package's side where it is importable (the device: its wheel, from --prepare)
  $PY -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('rfdetr') is None)" 2>/dev/null \
    && package=(--rfdetr-package)
  step "real-time training beside transformers, eager bf16" timeout $(limit ${RT_TRAIN_S:-200}) $PY \
    benchmarks/realtime_gpu.py "${RT[@]}" --sections train --modes eager "${package[@]}"
}
part_rt_infer() {
  step "real-time inference, eager" timeout $(limit ${RT_INFER_S:-110}) $PY benchmarks/realtime_gpu.py "${RT[@]}" \
    --sections infer --modes eager
}
part_rt_fit() {
  step "shapes set" $PY -m detr.commands.make_shapes --out "$SHAPES" "${SHAPES_SIZE[@]}"
  for family in $RT_FIT_FAMILIES; do
    step "detr fit $family shapes (bf16-mixed, $RT_FIT_STEPS steps)" timeout $(limit ${RT_FIT_S:-50}) \
      $PY -m detr.lightning.cli fit --config configs/${family}_shapes_cpu.yaml --data.root "$SHAPES" \
      --trainer.accelerator $DEVICE --trainer.devices 1 --trainer.precision bf16-mixed \
      --trainer.max_steps $RT_FIT_STEPS \
      --trainer.check_val_every_n_epoch 1000 --trainer.default_root_dir "$RUNS/fit_$family"
    [ -f "$RUNS/fit_$family/metrics.csv" ] && tail -n 2 "$RUNS/fit_$family/metrics.csv"
  done
}
part_rt_gate() {
  local checkpoints=()
  for file in "${CARRIED:-.gpu}"/*.pt; do [ -f "$file" ] && checkpoints+=("$file"); done
  if [ ${#checkpoints[@]} = 0 ]; then  # no trained model carried (the rehearsal): rt_fit's short runs
    for file in "$RUNS"/fit_*/checkpoints/last.ckpt; do [ -f "$file" ] && checkpoints+=("$file"); done
  fi
  step "accuracy gate: fp32, bf16, fp16, ONNX" timeout $(limit ${RT_GATE_S:-160}) $PY benchmarks/realtime_gpu.py \
    "${RT[@]}" --sections gate --limit-images "$GATE_IMAGES" --images "$SHAPES/val2017" \
    --annotations "$SHAPES/annotations/instances_val2017.json" \
    --checkpoints "${checkpoints[@]}"
}
part_rt_compile() {
  step "real-time inference, compiled bf16" timeout $(limit ${RT_COMPILE_INFER_S:-90}) $PY benchmarks/realtime_gpu.py \
    "${RT[@]}" --sections infer --modes compiled --ours-only
  step "real-time training, compiled bf16" timeout $(limit ${RT_COMPILE_TRAIN_S:-90}) $PY benchmarks/realtime_gpu.py \
    "${RT[@]}" --sections train --modes compiled --batches 8 --steps 30
}

for part in "${parts[@]}"; do
  if ! declare -F "part_$part" >/dev/null; then
    echo "unknown part '$part' (tests sdpa train infer loss commands compile all; rt_tests rt_train rt_infer rt_fit" \
      "rt_gate rt_compile realtime)"; FAILED=$((FAILED + 1)); continue
  fi
  start=$SECONDS
  FAILED_BEFORE=$FAILED
  # The part runs in this shell (not a pipeline's subshell), so FAILED counts its failed steps.
  exec 3>&1
  part_"$part" > >(tee "$OUT/$part.log" >&3) 2>&1
  wait $! 2>/dev/null
  echo "=== part $part: $((SECONDS - start)) s, $((FAILED - FAILED_BEFORE)) failed steps"
done
echo "ALL DONE in $SECONDS s, $FAILED failed steps"
[ $FAILED = 0 ]
