"""CPU inference of the real-time DETRs beside transformers, and beside this project's DETR-R50.

    .venv/bin/python benchmarks/realtime_speed.py [--threads 2] [--repeats 7] [--batch 1]
    .venv/bin/python benchmarks/realtime_speed.py --models rtdetr_r18 dfine_s --components
    .venv/bin/python benchmarks/realtime_speed.py --models rfdetr_nano rfdetr_base --no-detr --components
    PYTHONPATH=/tmp/rfdetr_pkg .venv/bin/python benchmarks/realtime_speed.py --models rfdetr_nano rfdetr_base \
        --no-detr --rfdetr-package        # after: pip install --target /tmp/rfdetr_pkg rfdetr --no-deps

Each model of the released layout (random weights everywhere: speed does not depend on them) is built by
transformers (``RTDetrForObjectDetection`` / ``DFineForObjectDetection`` / ``RfDetrForObjectDetection``), saved with
``save_pretrained``, loaded with ``detr.load_checkpoint`` and optimized as the Predictor runs it
(``optimize_for_inference``); both run a forward and the post-processing (transformers' image processor's
``post_process_object_detection``, ours ``PostProcess(top_k=300)``) on the two photos at 640 × 640 (RF-DETR at its
release's square: Nano 384, Base 560) (``--batch`` of them), float32, under ``torch.inference_mode``. DETR-R50
(``build_detr()``, optimized) runs on one 800 × 1066 image. Every repeat runs
every model once, transformers and ours in alternating order, after one warm-up round, so that all columns share
the machine's load; printed: medians (min-max) and the ratios. ``--components`` adds, per model, the medians of
backbone (RF-DETR: the ViT) / hybrid encoder (AIFI) or RF-DETR's projector / query selection / decoder layers
(cross- and self-attention) / post-processing,
timed by forward hooks (query selection: what the decoder module does besides its layers, for transformers what
the model does besides backbone, encoder and decoder). ``--rfdetr-package`` adds a third side for the RF-DETR models:
the authors' ``rfdetr`` package's own model of the release's preset (``build_model_from_config``, its own random
weights: the same layout and sizes) prepared as its ``RFDETR.inference()`` does by default (``export()``, then
``torch.jit.trace`` at the batch's size) with its ``PostProcess(num_select=300)``; only the package's model code is
imported (benchmarks/rfdetr_package_parity.py). Results: docs/measurements/speed.md. Needs transformers.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.helpers_*

from arithmetic import floor_table, product_rate
from machine import describe_machine

import detr
from detr.inference.postprocess import PostProcess
from tests.helpers_rtdetr import square_photos

#: The released models' layouts: (family, backbone, options of the transformers config).
_RTDETR = {"encoder_hidden_dim": 256, "d_model": 256, "encoder_ffn_dim": 1024, "decoder_ffn_dim": 1024,
           "decoder_in_channels": [256] * 3, "num_queries": 300, "encoder_attention_heads": 8,
           "decoder_attention_heads": 8}
_DFINE = {"num_queries": 300, "encoder_attention_heads": 8, "decoder_attention_heads": 8, "decoder_layers": 3}
MODELS = {
    "rtdetr_r18": ("RT-DETR R18, 3 decoder layers", "rtdetr", "resnet18", {**_RTDETR, "decoder_layers": 3}),
    "rtdetr_r50": ("RT-DETR R50, 6 decoder layers", "rtdetr", "resnet50", {**_RTDETR, "decoder_layers": 6}),
    "dfine_s": ("D-FINE S (HGNetV2 B0)", "dfine", "hgnetv2_b0", {
        **_DFINE, "levels": 3, "encoder_hidden_dim": 256, "d_model": 256, "encoder_ffn_dim": 1024,
        "decoder_ffn_dim": 1024, "decoder_in_channels": [256] * 3, "decoder_n_points": [3, 6, 3],
        "hidden_expansion": 0.5, "depth_mult": 0.34}),
    "dfine_l": ("D-FINE L (HGNetV2 B4, 6 decoder layers)", "dfine", "hgnetv2_b4", {
        **_DFINE, "levels": 3, "encoder_hidden_dim": 256, "d_model": 256, "encoder_ffn_dim": 1024,
        "decoder_ffn_dim": 1024, "decoder_in_channels": [256] * 3, "decoder_n_points": [3, 6, 3],
        "hidden_expansion": 1.0, "depth_mult": 1.0, "decoder_layers": 6}),
    "dfine_n": ("D-FINE N (HGNetV2 B0, 2 levels)", "dfine", "hgnetv2_b0", {
        **_DFINE, "levels": 2, "encoder_hidden_dim": 128, "d_model": 128, "encoder_ffn_dim": 512,
        "decoder_ffn_dim": 512, "decoder_in_channels": [128] * 2, "decoder_n_points": 6,
        "hidden_expansion": 0.34, "depth_mult": 0.5}),
    # the rfdetr package's presets (rfdetr/config.py): a ViT-S (384 wide, 12 blocks, 6 heads), 256-wide decoder,
    # 8 self- and 16 cross-attention heads, 2 points, 300 queries, 13 training groups, 3 C2f blocks
    "rfdetr_nano": ("RF-DETR Nano (ViT-S/16, 2 × 2 windows, 2 layers)", "rfdetr", None, {
        "vit": {"out_indices": [3, 6, 9, 12], "num_windows": 2, "patch_size": 16, "image_size": 24 * 16},
        "decoder_layers": 2}),
    "rfdetr_base": ("RF-DETR Base (ViT-S/14, 4 × 4 windows, 3 layers)", "rfdetr", None, {
        "vit": {"out_indices": [2, 5, 8, 11], "num_windows": 4, "patch_size": 14, "image_size": 37 * 14},
        "decoder_layers": 3}),
}
_RFDETR_VIT = {"hidden_size": 384, "num_hidden_layers": 12, "num_attention_heads": 6}
_RFDETR = {"d_model": 256, "decoder_self_attention_heads": 8, "decoder_cross_attention_heads": 16,
           "decoder_ffn_dim": 2048, "decoder_n_points": 2, "num_queries": 300, "group_detr": 13, "c2f_num_blocks": 3}
SIZE, DETR_SIZE = 640, (800, 1066)
#: The square of the models that are not run at SIZE: RF-DETR's releases' resolutions.
SIZES = {"rfdetr_nano": 384, "rfdetr_base": 560}
COMPONENTS = ("backbone", "encoder", "(AIFI)", "query selection", "decoder layers", "(cross-attention)",
              "(self-attention)", "post-processing")


def transformers_model(family: str, backbone: str, options: dict):
    if family == "rtdetr":
        from tests.helpers_rtdetr import hf_model
        return hf_model(backbone, 80, **options)
    if family == "rfdetr":
        from tests.helpers_rfdetr import hf_model
        options = dict(options)
        return hf_model(80, vit={**_RFDETR_VIT, **options.pop("vit")}, **{**_RFDETR, **options})
    from tests.helpers_dfine import hf_model
    return hf_model(backbone, 80, **options)


def pair_of_models(name: str):
    """``MODELS[name]``'s family, transformers' model (random weights) and ours loaded from its ``save_pretrained``
    files: the same weights on both sides."""
    _, family, backbone, options = MODELS[name]
    theirs = transformers_model(family, backbone, options)
    with tempfile.TemporaryDirectory() as directory:
        theirs.save_pretrained(directory)
        ours = detr.load_checkpoint(directory)
    return family, theirs, ours


def rfdetr_package_model(name: str, device: str = "cpu"):
    """The authors' ``rfdetr`` package (only its model code: benchmarks/rfdetr_package_parity.py): its config
    module and ``rfdetr.models.lwdetr``, the ModelConfig of ``name``'s preset (80 classes) and that model, built
    with the package's own random weights (the same layout and sizes)."""
    from rfdetr_package_parity import PRESETS, import_package_models

    config_module, lwdetr = import_package_models()
    preset = PRESETS[name.replace("_", "-").replace("rfdetr", "rf-detr")]
    # a pretrain_weights name keeps the builder from fetching DINOv2's weights (build_model_from_config loads none)
    model_config = getattr(config_module, preset)(pretrain_weights="unused.pth", num_classes=80, device=device)
    return config_module, lwdetr, model_config, lwdetr.build_model_from_config(model_config)


class Stopwatch:
    """Seconds spent in each hooked module's forward, summed per name until :meth:`clear`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._started: dict[int, float] = {}

    def watch(self, name: str, module: torch.nn.Module) -> None:
        def start(*_) -> None:
            self._started[id(module)] = time.perf_counter()

        def stop(*_) -> None:
            self.seconds[name] += time.perf_counter() - self._started.pop(id(module))
        module.register_forward_pre_hook(start)
        module.register_forward_hook(stop)

    def clear(self) -> None:
        self.seconds.clear()


def watch_ours(watch: Stopwatch, model) -> None:
    watch.watch("backbone", model.backbone)
    if hasattr(model, "projector"):  # RF-DETR: the projector in the encoder's row, its decoder's layers directly
        for projector in model.projector:
            watch.watch("encoder", projector)
        watch.watch("decoder", model.decoder)
        for layer in model.decoder.layers:
            watch.watch("decoder layers", layer)
            watch.watch("(cross-attention)", layer.cross_attn)
            watch.watch("(self-attention)", layer.self_attn)
        return
    watch.watch("encoder", model.encoder)
    for aifi in getattr(model.encoder, "encoder", []):
        watch.watch("(AIFI)", aifi)
    watch.watch("decoder", model.decoder)
    for layer in model.decoder.decoder.layers:
        watch.watch("decoder layers", layer)
        watch.watch("(cross-attention)", layer.cross_attn)
        watch.watch("(self-attention)", layer.self_attn)


def watch_theirs(watch: Stopwatch, model) -> None:
    inner = model.model
    watch.watch("model", inner)
    if hasattr(inner.backbone, "projector"):  # RF-DETR: the ViT, its projector
        watch.watch("backbone", inner.backbone.backbone)
        watch.watch("encoder", inner.backbone.projector)
        watch.watch("decoder layers", inner.decoder)
        for layer in inner.decoder.layers:
            watch.watch("(cross-attention)", layer.cross_attn)
            watch.watch("(self-attention)", layer.self_attn)
        return
    watch.watch("backbone", inner.backbone)
    watch.watch("encoder", inner.encoder)
    for projection in inner.encoder_input_proj:
        watch.watch("encoder", projection)
    for aifi in getattr(inner.encoder, "aifi", []):
        watch.watch("(AIFI)", aifi)
    watch.watch("decoder layers", inner.decoder)  # with the per-layer heads, which ours counts in query selection
    for layer in inner.decoder.layers:
        watch.watch("(cross-attention)", layer.encoder_attn)
        watch.watch("(self-attention)", layer.self_attn)


def components(seconds: dict[str, float], ours: bool) -> dict[str, float]:
    parts = dict(seconds)
    if ours:
        parts["query selection"] = parts.pop("decoder") - parts["decoder layers"]
    else:
        parts["query selection"] = (parts.pop("model") - parts["backbone"] - parts["encoder"]
                                    - parts["decoder layers"])
    return parts


def rfdetr_package_side(name: str, images: torch.Tensor) -> Callable[[], None]:
    """The rfdetr package's model of ``name``'s preset, exported and traced as its ``inference()`` does, with its
    post-processing: a run of one batch."""
    from tests.helpers import randomise

    model = rfdetr_package_model(name)[3].eval()
    randomise(model, 0)
    model.export()
    traced = torch.jit.trace(model, images)
    postprocess = importlib.import_module("rfdetr.models.postprocess").PostProcess(num_select=300)
    sizes = torch.tensor([list(images.shape[-2:])] * len(images))

    def run() -> None:
        boxes, logits = traced(images)[:2]
        postprocess({"pred_logits": logits, "pred_boxes": boxes}, sizes)
    return run


def median_text(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batch", type=int, default=1, choices=(1, 2))
    parser.add_argument("--no-detr", action="store_true", help="skip DETR-R50 at 800 × 1066")
    parser.add_argument("--components", action="store_true", help="also time each model's parts")
    parser.add_argument("--rfdetr-package", action="store_true",
                        help="also time the rfdetr package's traced model for the RF-DETR models (on PYTHONPATH)")
    parser.add_argument("--flops", action="store_true",
                        help="also count each side's dense arithmetic and its least time at this machine's best "
                             "product rate (benchmarks/arithmetic.py)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import RfDetrImageProcessor, RTDetrImageProcessor

    postprocess = PostProcess("sigmoid", top_k=300)
    runs, watches = {}, {}
    for name in args.models:
        family, theirs, ours = pair_of_models(name)
        ours = ours.optimize_for_inference()
        side = SIZES.get(name, SIZE)
        images = square_photos(side)[: args.batch]
        mask = torch.zeros(args.batch, side, side, dtype=torch.bool)
        sizes = torch.tensor([[side, side]] * args.batch)
        processor = RfDetrImageProcessor() if family == "rfdetr" else RTDetrImageProcessor()
        watches[name] = {"theirs": Stopwatch(), "ours": Stopwatch()}
        if args.components:
            watch_theirs(watches[name]["theirs"], theirs)
            watch_ours(watches[name]["ours"], ours)

        def run_theirs(model=theirs, watch=watches[name]["theirs"], images=images, sizes=sizes,
                       processor=processor) -> None:
            outputs = model(pixel_values=images)
            start = time.perf_counter()
            processor.post_process_object_detection(outputs, threshold=0.0, target_sizes=sizes)
            watch.seconds["post-processing"] += time.perf_counter() - start

        def run_ours(model=ours, watch=watches[name]["ours"], images=images, mask=mask, sizes=sizes) -> None:
            outputs = model(images, mask)
            start = time.perf_counter()
            postprocess(outputs, sizes)
            watch.seconds["post-processing"] += time.perf_counter() - start
        runs[name] = {"theirs": run_theirs, "ours": run_ours}
        if args.rfdetr_package and family == "rfdetr":
            runs[name]["rfdetr"] = rfdetr_package_side(name, images)
            watches[name]["rfdetr"] = Stopwatch()
    if not args.no_detr:
        torch.manual_seed(0)
        model = detr.build_detr().optimize_for_inference()
        detr_images = square_photos(SIZE)[:1]
        detr_images = torch.nn.functional.interpolate(detr_images, size=DETR_SIZE, mode="bilinear")
        detr_mask = torch.zeros(1, *DETR_SIZE, dtype=torch.bool)
        runs["detr_r50"] = {"ours": lambda: model(detr_images, detr_mask)}
        watches["detr_r50"] = {"ours": Stopwatch()}
    load_before = os.getloadavg()
    times: dict[str, dict[str, list[float]]] = {name: defaultdict(list) for name in runs}
    parts: dict[str, dict[str, dict[str, list[float]]]] = {
        name: {side: defaultdict(list) for side in ("theirs", "ours")} for name in runs}
    with torch.inference_mode():
        for repeat in range(args.repeats + 1):  # round 0: warm-up
            for name, sides in runs.items():
                for side in sorted(sides, reverse=repeat % 2 == 1):
                    watch = watches[name][side]
                    watch.clear()
                    start = time.perf_counter()
                    sides[side]()
                    elapsed = time.perf_counter() - start
                    if repeat:
                        times[name][side].append(elapsed)
                        if args.components and name in MODELS and side != "rfdetr":
                            for part, value in components(watch.seconds, side == "ours").items():
                                parts[name][side][part].append(value)
            print(f"round {repeat} done, load average {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
    print(describe_machine())
    print(f"load average before the timed rounds {' '.join(f'{v:.1f}' for v in load_before)}, after "
          f"{' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    print(f"batch {args.batch}, {args.repeats} alternating repeats, medians (min-max) in seconds\n")
    reference = statistics.median(times["detr_r50"]["ours"]) if "detr_r50" in times else None
    print("| model | input | transformers | ours (optimized) | ours / transformers | DETR-R50 / ours |")
    print("|---|---|---|---|---|---|")
    for name in runs:
        ours_median = statistics.median(times[name]["ours"])
        if name == "detr_r50":
            print(f"| DETR R50 (this project, optimized) | 1 × {DETR_SIZE[0]} × {DETR_SIZE[1]} | | "
                  f"{median_text(times[name]['ours'])} | | 1.0 |")
            continue
        ratio = ours_median / statistics.median(times[name]["theirs"])
        speedup = f"{reference * args.batch / ours_median:.1f}" if reference is not None else ""
        side = SIZES.get(name, SIZE)
        print(f"| {MODELS[name][0]} | {args.batch} × {side} × {side} | {median_text(times[name]['theirs'])} | "
              f"{median_text(times[name]['ours'])} | {ratio:.2f} | {speedup} |")
    package = [name for name in runs if "rfdetr" in runs[name]]
    if package:
        print("\n| model | rfdetr package (export + jit.trace) | ours (optimized) | ours / rfdetr | "
              "ours / the faster of the two |")
        print("|---|---|---|---|---|")
        for name in package:
            ours_median = statistics.median(times[name]["ours"])
            faster = min(statistics.median(times[name]["rfdetr"]), statistics.median(times[name]["theirs"]))
            print(f"| {MODELS[name][0]} | {median_text(times[name]['rfdetr'])} | {median_text(times[name]['ours'])} | "
                  f"{ours_median / statistics.median(times[name]['rfdetr']):.2f} | {ours_median / faster:.2f} |")
    if args.components:
        for name in args.models:
            print(f"\n{MODELS[name][0]}, batch {args.batch}: medians in ms")
            print("| part | transformers | ours | ours / transformers |")
            print("|---|---|---|---|")
            for part in COMPONENTS:
                theirs = statistics.median(parts[name]["theirs"][part] or [0.0]) * 1e3
                ours = statistics.median(parts[name]["ours"][part] or [0.0]) * 1e3
                ratio = f"{ours / theirs:.2f}" if theirs else ""
                print(f"| {part} | {theirs:.0f} | {ours:.0f} | {ratio} |")
    if args.flops:
        compared = {name: runs[name] for name in args.models}
        with torch.inference_mode():
            print("\n" + floor_table(compared, {name: statistics.median(times[name]["theirs"]) for name in compared},
                                     product_rate()))


if __name__ == "__main__":
    main()
