"""Command-line options shared by the tools that run a checkpoint on images (``detr-predict``,
``detr-explore``, ``detr-visualize-attention``), and the commands' one-line expected errors
(:func:`one_line_errors`: a checkpoint that cannot be read or downloaded, an output folder another run
owns, print ``error: <what and the fix>`` and exit 2; a traceback is for bugs, ``DETR_DEBUG=1`` shows one
for these too).

Nothing here imports torch at module level: a command builds its parser from these and answers ``--help``
before loading a model (tests/commands/test_commands.py checks that no command's ``--help`` imports torch)."""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any


def add_slice_arguments(parser: argparse.ArgumentParser) -> None:
    """``--slice SIZE``, ``--slice-overlap F`` and ``--slice-merge``: sliced inference
    (:class:`detr.inference.slicing.SliceSettings`; defaults written out here so that ``--help`` does not import
    torch). :func:`slice_settings` turns them into the settings."""
    parser.add_argument("--slice", type=positive_int, default=None, metavar="SIZE",
                        help="predict overlapping SIZE x SIZE px tiles of each image plus the whole image, and merge "
                             "them: for small objects on images much larger than the model's input (e.g. the "
                             "model's input size; default: the whole image only)")
    parser.add_argument("--slice-overlap", type=fraction_below_one, default=0.2, metavar="F",
                        help="with --slice: the fraction of a tile its neighbour overlaps, in [0, 1) (default 0.2); "
                             "objects smaller than the overlap are seen whole by a tile")
    parser.add_argument("--slice-merge", choices=("nms", "nmm"), default="nms",
                        help="with --slice: how the tiles' duplicates merge: class-wise NMS (default) or greedy "
                             "non-maximum merging (enclosing box, union of masks)")


def slice_settings(args: argparse.Namespace) -> Any:
    """The :class:`detr.inference.slicing.SliceSettings` of :func:`add_slice_arguments`' options; None without
    ``--slice``."""
    if args.slice is None:
        return None
    from detr.inference.slicing import SliceSettings  # here, so that --help does not wait for torch

    return SliceSettings(size=args.slice, overlap=args.slice_overlap, merge=args.slice_merge)


def add_resize_arguments(parser: argparse.ArgumentParser) -> None:
    """``--min-size`` / ``--max-size`` (default None: the size the checkpoint was validated at, else the
    authors' 800 / 1333, :data:`detr.models.inputs.EVAL_MIN_SIZE` and ``EVAL_MAX_SIZE``, written out here so
    that ``--help`` does not import torch; see :class:`detr.inference.predictor.Predictor`)."""
    parser.add_argument("--min-size", type=positive_int, default=None,
                        help="eval resize: shortest side (default: the checkpoint's validation size, else 800)")
    parser.add_argument("--max-size", type=positive_int, default=None,
                        help="eval resize: longest side cap (default: the checkpoint's validation size, else 1333)")


#: the PyTorch inference precisions (:data:`detr.inference.predictor.AUTOCAST_DTYPES`), written out here so that
#: ``--help`` does not import torch (a test keeps the two equal)
PRECISIONS = ("fp32", "bf16", "fp16")


def add_precision_argument(parser: argparse.ArgumentParser) -> None:
    """``--precision``: :class:`detr.inference.predictor.Predictor`'s ``precision`` (autocast dtype)."""
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32",
                        help="fp32 (default), bf16 (bfloat16 autocast) or fp16 (float16 autocast), on CPU and CUDA; "
                             "an exported .onnx runs in fp32 only, an OpenVINO .xml in fp32 or bf16")


#: Every model family of the package, by its name (:data:`detr.models.FAMILIES`; a test keeps the two equal), as the
#: help texts name it: written here so that ``--help`` does not import torch.
FAMILY_NAMES: dict[str, str] = {"detr": "DETR", "deformable": "Deformable DETR", "rtdetr": "RT-DETR",
                                "dfine": "D-FINE", "deimv2": "DEIMv2", "rfdetr": "RF-DETR",
                                "grounding": "Grounding DINO"}
#: Each family's presets (:func:`detr.models.family.presets`; a test keeps the two equal), for ``detr --help``.
PRESET_NAMES: dict[str, tuple[str, ...]] = {
    "detr": ("detr_r50", "detr_r50_dc5", "detr_r101", "detr_r101_dc5"),
    "deformable": ("deformable_detr", "deformable_detr_box_refine", "deformable_detr_two_stage"),
    "rtdetr": ("rtdetr_r18vd", "rtdetr_r50vd", "rtdetr_r101vd"),
    "dfine": ("dfine_n", "dfine_s", "dfine_m", "dfine_l", "dfine_x", "deim_dfine_s"),
    "deimv2": ("deimv2_n", "deimv2_l", "deimv2_x"),
    "rfdetr": ("rfdetr_nano", "rfdetr_small", "rfdetr_medium", "rfdetr_base", "rfdetr_large", "rfdetr_seg_preview",
               "rfdetr_seg_nano", "rfdetr_seg_small", "rfdetr_seg_medium", "rfdetr_seg_large", "rfdetr_seg_xlarge",
               "rfdetr_seg_2xlarge", "rfdetr_keypoint_preview", "lwdetr_tiny", "lwdetr_small", "lwdetr_medium",
               "lwdetr_large", "lwdetr_xlarge"),
    "grounding": ("grounding_dino_tiny", "mm_grounding_dino_tiny"),
}
#: The families without a training recipe here (their record's ``recipe`` is None; a test keeps the two equal):
#: they predict, label and serve from a transformers directory, and ``detr fit`` refuses them.
PREDICT_ONLY_FAMILIES: tuple[str, ...] = ("grounding",)


def family_list(architectures: Iterable[str] = FAMILY_NAMES) -> str:
    """"DETR, Deformable DETR, ... and RF-DETR": the families ``architectures`` (default: every one) in words."""
    names = [FAMILY_NAMES[architecture] for architecture in architectures]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


#: What every command's checkpoint argument takes: what :func:`detr.load_checkpoint` reads.
CHECKPOINT_HELP = ("a released model's name (detr-r50, detr-r101-dc5, ...: downloaded on first use; 'list' prints "
                   "them), a .pth / .ckpt file (the authors' releases, this project's runs: "
                   "RUN/checkpoints/last.ckpt or best-*.ckpt; or its http(s) URL: downloaded once into torch's hub "
                   "cache), a Hugging Face transformers directory (detr-convert's, or a download of "
                   "facebook/detr-resnet-50) or a hub id (PekingU/rtdetr_r50vd: downloaded with huggingface_hub; "
                   "'list' names those the docs give)")
#: What the commands that predict through the Predictor also take (``onnx=True``).
ONNX_HELP = "; or a file of detr-export: .onnx (run on ONNX Runtime) or .xml (OpenVINO)"


def add_checkpoint_argument(parser: argparse.ArgumentParser, *, positional: bool = False, onnx: bool = False) -> None:
    """The checkpoint argument, one help for every command: ``--checkpoint`` (required), or ``CHECKPOINT``
    when ``positional``; ``onnx``: the command also runs ``.onnx`` files. ``list`` prints the released names."""
    text = CHECKPOINT_HELP + (ONNX_HELP if onnx else "")
    if positional:
        parser.add_argument("checkpoint", action=CheckpointArgument, metavar="CHECKPOINT", help=text)
    else:
        parser.add_argument("--checkpoint", required=True, action=CheckpointArgument, help=text)


class CheckpointArgument(argparse.Action):
    """``--checkpoint`` of the tools: a path or a released model's name; ``list`` prints the names and exits
    (before the other arguments are checked, like ``--version``)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if values == "list":  # the table is data: printed without importing torch or a model family
            print(released_table(json.loads(RELEASED_FILE.read_text()), torch_hub_dir() / "checkpoints"))
            parser.exit()
        setattr(namespace, self.dest, values)


#: The released models (:mod:`detr.checkpoints.released` builds its records from this file).
RELEASED_FILE = Path(__file__).resolve().parents[1] / "checkpoints" / "released.json"


def released_table(table: dict[str, Any], cache: Path) -> str:
    """The table of released models: name, file, published COCO val2017 AP (``table``: released.json's), the
    folder ``cache`` they are downloaded to, then the Hugging Face hub models the docs name."""
    lines = [f"{'name':<22} {'file':<36} {'published (COCO val2017)'}"]
    for row in table["released"]:
        metrics = row["metrics"]
        scores = f"box AP {metrics['box_ap']}"
        if row["task"] == "panoptic":
            scores += f", segm AP {metrics['segm_ap']}, PQ {metrics['pq']} (panoptic)"
        lines.append(f"{row['name']:<22} {row['file']:<36} {scores}")
    lines.append(f"files are downloaded on first use to {cache}")
    lines.append("Hugging Face hub models the docs name (load_checkpoint downloads an id with huggingface_hub; "
                 "or: huggingface-cli download ID --local-dir DIR, then pass DIR):")
    lines.extend(f"  {family:<20} {', '.join(ids)}" for family, ids in table["hub"].items())
    return "\n".join(lines)


def torch_hub_dir() -> Path:
    """``torch.hub.get_dir()`` as torch computes it when no program has set it: ``$TORCH_HOME/hub``, else
    ``$XDG_CACHE_HOME/torch/hub``, else ``~/.cache/torch/hub`` (here, so that listing names does not import
    torch)."""
    home = os.environ.get("TORCH_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "torch")
    return Path(os.path.expanduser(home)) / "hub"


def device_argument(value: str) -> str | None:
    """argparse ``type`` of ``--device``: "auto" (None: CUDA when available, else the CPU), "cpu", "cuda",
    "cuda:N" (or "mps"), checked before any model loads: a name torch does not know, or a CUDA device this
    machine does not have, is a usage error that names the choices (torch's own errors came after loading the
    model, as a traceback)."""
    if value == "auto":
        return None
    import torch  # here, so that --help does not wait for it

    try:
        device = torch.device(value)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"{value!r} is not a device: use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise argparse.ArgumentTypeError(f"{value!r}: this machine has no CUDA GPU that torch can use "
                                             "(torch.cuda.is_available() is False); use --device cpu")
        if device.index is not None and device.index >= count:
            raise argparse.ArgumentTypeError(f"{value!r}: this machine has {count} CUDA GPU(s), cuda:0 .. "
                                             f"cuda:{count - 1}")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise argparse.ArgumentTypeError(f"{value!r}: MPS (Apple GPU) is not available here; use --device cpu")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise argparse.ArgumentTypeError(f"{value!r}: use auto, cpu, cuda or cuda:N")
    return value


class NumberRange:
    """argparse ``type`` of a numeric option: a finite ``int`` or ``float`` in a range, checked where the option is
    parsed, so that a value out of range is argparse's one-line usage error naming the option (exit 2) before any
    model loads, never a traceback from deep inside. NaN and infinities are refused (a NaN passes every ``<``
    comparison and would turn a check off).

    kind: ``int`` or ``float``. low, high: the bounds (None: unbounded on that side); low_open / high_open:
    the bound itself is excluded (``positive_float``'s 0). The attributes are public: tests feed each option
    the values just outside its range."""

    def __init__(self, kind: type, low: float | None = None, high: float | None = None, *,
                 low_open: bool = False, high_open: bool = False) -> None:
        if kind not in (int, float):
            raise TypeError(f"kind must be int or float, got {kind!r}")
        self.kind, self.low, self.high, self.low_open, self.high_open = kind, low, high, low_open, high_open

    def __call__(self, value: str) -> int | float:
        try:
            number = self.kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{value!r} is not {'an integer' if self.kind is int else 'a number'}") from None
        below = self.low is not None and (number <= self.low if self.low_open else number < self.low)
        above = self.high is not None and (number >= self.high if self.high_open else number > self.high)
        if not math.isfinite(number) or below or above:
            raise argparse.ArgumentTypeError(f"{value} is out of range: it must be {self.describe()}")
        return number

    def describe(self) -> str:
        """The range in words: "a number in [0, 1]", "an integer >= 1", "a number > 0"."""
        noun = "an integer" if self.kind is int else "a finite number"
        if self.low is not None and self.high is not None:
            return (f"{noun} in {'(' if self.low_open else '['}{self.low:g}, "
                    f"{self.high:g}{')' if self.high_open else ']'}")
        if self.low is not None:
            return f"{noun} {'>' if self.low_open else '>='} {self.low:g}"
        if self.high is not None:
            return f"{noun} {'<' if self.high_open else '<='} {self.high:g}"
        return noun

    def __repr__(self) -> str:  # argparse names the type in some messages
        return self.describe()


def bounded_int(low: int | None, high: int | None = None) -> NumberRange:
    """argparse ``type``: an integer in [low, high] (no bound where None)."""
    return NumberRange(int, low, high)


#: argparse ``type``: an integer >= 1 (a count, a size in pixels, a batch size)
positive_int = NumberRange(int, 1)
#: argparse ``type``: an integer >= 0 (a count that may be zero: 0 images, 0 workers)
non_negative_int = NumberRange(int, 0)
#: argparse ``type``: any finite integer (a seed, a Python index)
any_int = NumberRange(int)
#: argparse ``type``: a probability, score or fraction in [0, 1]
probability = NumberRange(float, 0.0, 1.0)
#: argparse ``type``: a fraction in [0, 1) (an overlap: 1 would never advance)
fraction_below_one = NumberRange(float, 0.0, 1.0, high_open=True)
#: argparse ``type``: a finite number > 0 (a size in MiB, a budget in minutes)
positive_float = NumberRange(float, 0.0, low_open=True)
#: argparse ``type``: a finite number >= 0 (a timeout in seconds, an AP drop in points)
non_negative_float = NumberRange(float, 0.0)


#: The exit status of an expected error (argparse's for a bad command line).
EXPECTED_ERROR_STATUS = 2


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is (:func:`sigterm_as_interrupt`): a subclass of
    KeyboardInterrupt, so that every ``finally`` and ``except KeyboardInterrupt`` treats it as Ctrl-C."""


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block SIGTERM (a job scheduler's stop, ``kill``) raises :class:`Terminated` instead of ending
    the process at once: a command's ``finally`` blocks write what was done and release its output folder, as
    on Ctrl-C (SIGTERM's default left no predictions.json and a stale run.lock). Outside the main thread,
    where no handler can be set, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise Terminated(f"stopped by {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def interrupted_status(stop: KeyboardInterrupt) -> int:
    """A shell's exit status for a command stopped by ``stop``: 128 + SIGTERM (143) or 128 + SIGINT (130)."""
    return 128 + (signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT)


def report_skipped(skipped: Sequence[tuple[Any, str]]) -> int:
    """Name on stderr each input file a command skipped (path, reason); its exit status: 1 if any, else 0."""
    if not skipped:
        return 0
    print(f"skipped {len(skipped)} file(s) that could not be read or predicted:", file=sys.stderr)
    for path, reason in skipped:
        print(f"  {path}: {reason}", file=sys.stderr)
    return 1


def keep_output_on_stop(write: Callable[[], int], kept: str) -> int:
    """Run a command's ``write`` (which writes its output whole or not at all) with SIGTERM as Ctrl-C; a write that
    fails on the file system (a full disk, a read-only folder: ``OSError``) or a stop (Ctrl-C, SIGTERM) becomes one
    line ending in ``kept`` (what stayed as it was), with exit status 1, or 130 / 143. Returns ``write``'s status."""
    try:
        with sigterm_as_interrupt():
            return write()
    except OSError as error:  # nothing was moved into place
        where = f" writing {error.filename}" if error.filename else ""
        print(f"error: {error.strerror or error}{where}; {kept}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as stop:
        print(f"\n{'SIGTERM' if isinstance(stop, Terminated) else 'Ctrl-C'}: stopped; {kept}", file=sys.stderr)
        return interrupted_status(stop)


def one_line_errors(main: Callable[..., int], also: tuple[type[Exception], ...] = ()) -> Callable[..., int]:
    """Wrap a command's ``main``: an expected error (:func:`expected_errors`, and the kinds in ``also``: the
    training command's bad data and settings) is printed as one line on stderr and the command exits
    :data:`EXPECTED_ERROR_STATUS`; with ``DETR_DEBUG`` set it is raised as before."""

    @functools.wraps(main)
    def run(*args: object, **kwargs: object) -> int:
        try:
            return main(*args, **kwargs)
        except Exception as error:
            if not isinstance(error, (*expected_errors(), *also)) or os.environ.get("DETR_DEBUG"):
                raise
            print(f"error: {error}", file=sys.stderr)
            return EXPECTED_ERROR_STATUS

    return run


def expected_errors() -> tuple[type[Exception], ...]:
    """The errors a user meets with a correct program, each message naming the file and the fix (imported
    when an error comes, so that a command's ``--help`` does not wait for torch)."""
    from detr.checkpoints.formats import CheckpointError
    from detr.output_folder import OutputFolderError

    return (CheckpointError, OutputFolderError)
