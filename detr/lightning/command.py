"""``detr`` and ``detr-panoptic`` as the shell runs them: the overview that ``detr --help`` prints without
loading torch or Lightning, then the LightningCLI of :mod:`detr.lightning.cli` for a subcommand.

``detr --help`` (or ``detr`` alone) lists the subcommands and the configs; ``detr fit --help`` is
LightningCLI's list of every option, each with the sentence of its docstring. Calling
:func:`detr.lightning.cli.main` from Python raises errors as they are; these entry points print the expected
ones (:func:`detr.inference.command_line.one_line_errors`) as one line and exit 2.
"""

from __future__ import annotations

import sys
import textwrap

from detr.inference.command_line import FAMILY_NAMES, PREDICT_ONLY_FAMILIES, PRESET_NAMES, family_list

SUBCOMMANDS = ("fit", "validate", "test", "predict")

#: The configs in configs/ that each command trains, by what they are for (tests check that every file there
#: is named, and every name here is a file).
DETECTION_CONFIGS = {
    "the authors' COCO recipes (GPUs; --data.root DIR of COCO 2017)": (
        "detr_r50_coco.yaml", "detr_r50_dc5_coco.yaml", "detr_r101_coco.yaml", "detr_r101_dc5_coco.yaml",
        "detr_coco.yaml (the base they include)", "deformable_detr_coco.yaml"),
    "the real-time DETRs' COCO recipes (GPUs; --data.root DIR of COCO 2017)": (
        "rtdetr_r18vd_coco.yaml", "rtdetr_r50vd_coco.yaml", "dfine_n_coco.yaml", "dfine_s_coco.yaml",
        "dfine_m_coco.yaml", "dfine_l_coco.yaml", "dfine_x_coco.yaml",
        "deim_dfine_s_coco.yaml (D-FINE S with DEIM's mosaic, MixUp and MAL)",
        "rfdetr_base_coco.yaml (from --model.init_checkpoint, as the authors)"),
    "fine-tuning a released checkpoint on your own set (COCO json, a YOLO folder, Pascal VOC)": (
        "finetune_custom.yaml (DETR R50, a GPU)",
        "finetune_custom_cpu.yaml (DETR R50 on a 2-core CPU: 384-px images, a time budget)",
        "deformable_finetune_custom.yaml (Deformable DETR, a GPU)",
        "rtdetr_finetune_custom.yaml (RT-DETR R18-vd, a GPU)",
        "dfine_finetune_custom.yaml (D-FINE S, a GPU)", "deimv2_finetune_custom.yaml (DEIMv2 N, a GPU)",
        "rfdetr_finetune_custom.yaml (RF-DETR Base, a GPU)"),
    "CPU demos on the synthetic shapes set (detr-make-shapes writes data/shapes)": (
        "demo_shapes_cpu.yaml (what detr-demo trains)", "deformable_shapes_cpu.yaml", "rtdetr_shapes_cpu.yaml",
        "dfine_shapes_cpu.yaml", "deimv2_shapes_cpu.yaml", "rfdetr_shapes_cpu.yaml",
        "rfdetr_seg_shapes_cpu.yaml (instance masks: detr-make-shapes --masks rle --out data/shapes-rle)",
        "rfdetr_keypoints_shapes_cpu.yaml (keypoints: detr-make-shapes --keypoints --out data/shapes-kp)",
        "demo_shapes_tracking_cpu.yaml (tracking clips' frames for detr-track: detr-make-shapes --clips --out "
        "data/shape-clips)"),
}
PANOPTIC_CONFIGS = {
    "the authors' two-stage COCO panoptic recipe (boxes, then the mask head on the frozen box model)": (
        "panoptic_boxes_coco.yaml", "panoptic_coco.yaml"),
    "its CPU demo on the synthetic shapes set (detr-make-shapes --panoptic)": (
        "demo_shapes_panoptic_boxes_cpu.yaml", "demo_shapes_panoptic_cpu.yaml"),
}


#: After a family without a training recipe in the presets' list.
PREDICT_ONLY_NOTE = (" (not detr fit: detr-predict --prompt, detr-autolabel, detr-serve; fine-tuned in Python by "
                     "detr.lightning.grounding_system)")


def overview(prog: str) -> str:
    """What ``prog --help`` prints: the subcommands, the configs and where every option is described."""
    panoptic = prog == "detr-panoptic"
    what = ("Panoptic segmentation with DETR (paper §4.4): train, evaluate and run the box stage and the\n"
            "mask stage, through Lightning." if panoptic else
            textwrap.fill(f"Train, evaluate and run DETR detectors of every family through Lightning: "
                          f"{family_list(name for name in FAMILY_NAMES if name not in PREDICT_ONLY_FAMILIES)} (the "
                          f"paper's DETR also with its anchor variants for short CPU budgets).",
                          width=100, break_on_hyphens=False))
    configs = PANOPTIC_CONFIGS if panoptic else DETECTION_CONFIGS
    lines = [
        f"usage: {prog} {{{','.join(SUBCOMMANDS)}}} --config configs/FILE.yaml [--KEY VALUE ...]",
        "",
        what,
        "",
        "subcommands:",
        "  fit       train; the run's checkpoints, metrics.csv, TensorBoard events and config.yaml go into",
        "            --trainer.default_root_dir (a second run there is refused; --ckpt_path RUN/checkpoints/",
        "            last.ckpt resumes it, --overwrite_run true starts over)",
        "  validate  COCO evaluation on the validation set of the weights in --ckpt_path (or",
        "            --model.init_checkpoint), written into <default_root_dir>/validate/",
        "  test      the same on the test split (--data.test_images / --data.test_annotations; default: the",
        "            validation split), into <default_root_dir>/test/",
        "  predict   predictions.json and drawings for --data.predict_images (a folder or files) with",
        "            --ckpt_path, into <default_root_dir>/predict/",
        "",
        "configs (in a clone's configs/; a YAML key is the option's name: --data.root DIR overrides data.root):",
    ]
    for purpose, names in configs.items():
        lines.append(f"  {purpose}:")
        lines += [f"    configs/{name}" for name in names]
    if not panoptic:
        lines += ["", "model families and their presets (--model.detr PRESET, or model.detr: PRESET in a YAML; a",
                  "family's own options: --model.detr CLASS --model.detr.help CLASS):"]
        lines += [textwrap.fill(f"{FAMILY_NAMES[family]}: {', '.join(names) or '(no preset yet)'}"
                                f"{PREDICT_ONLY_NOTE if family in PREDICT_ONLY_FAMILIES else ''}", width=116,
                                initial_indent="  ", subsequent_indent="      ", break_long_words=False,
                                break_on_hyphens=False) for family, names in PRESET_NAMES.items()]
    lines += [
        "",
        "options:",
        "  SUBCOMMAND --help   every option of the subcommand with its meaning (the model: --model.*, the",
        "                      detector: --model.detr.*, its family's recipe: --model.loss.*, --model.optimizer.*,",
        "                      the data: --data.*, Lightning: --trainer.*)",
        "  --print_config      print the configuration the other arguments make, and exit",
        "  --debug             show the traceback of an expected error (DETR_DEBUG=1 does the same)",
        "",
        "examples:",
        f"  {prog} fit --config configs/{'demo_shapes_panoptic_boxes_cpu' if panoptic else 'demo_shapes_cpu'}.yaml",
        (f"  {prog} validate --config configs/{'panoptic_coco' if panoptic else 'detr_r50_coco'}.yaml "
         "--data.root /data/coco --ckpt_path RUN/checkpoints/last.ckpt"),
        "",
        "docs/guides/train-on-your-data.md explains the recipes, the run folder and resuming.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None, *, panoptic: bool = False) -> int:
    """Entry point of ``detr`` (``panoptic``: of ``detr-panoptic``): the overview for ``--help`` or no
    arguments, else :func:`detr.lightning.cli.main` with its expected errors as one line (status 2);
    ``--debug`` (anywhere) or ``DETR_DEBUG=1`` shows their traceback instead."""
    args = list(sys.argv[1:] if argv is None else argv)
    prog = "detr-panoptic" if panoptic else "detr"
    if not args or args[0] in ("-h", "--help"):
        print(overview(prog), file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    debug = "--debug" in args
    args = [arg for arg in args if arg != "--debug"]
    from detr.inference.command_line import one_line_errors  # after the overview: it needs none of this
    from detr.lightning import cli  # torch and Lightning: seconds

    run = cli.main if debug else one_line_errors(cli.main, also=cli.EXPECTED_ERRORS)
    return run(args, panoptic=panoptic)


def panoptic_main(argv: list[str] | None = None) -> int:
    """Entry point of ``detr-panoptic``: :func:`main` over the panoptic system and data."""
    return main(argv, panoptic=True)


if __name__ == "__main__":
    sys.exit(main())
