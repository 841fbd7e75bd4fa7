"""benchmarks/convergence.py: the ``demo`` preset is what configs/demo_shapes_cpu.yaml trains, and ``--seeds``
trains one run per shapes-generator seed, evaluated every N steps, then prints AP50 at the report steps."""

from __future__ import annotations

import re

import pytest
import yaml

from tests.helpers import REPO, load_script

pytestmark = pytest.mark.usefixtures("one_thread", "bare_argv")

TINY = ["detr.hidden_dim=32", "detr.num_heads=2", "detr.num_encoder_layers=1", "detr.num_decoder_layers=2",
        "detr.dim_feedforward=64", "detr.num_queries=6", "batch_size=2"]


def test_demo_preset_is_the_demo_yaml() -> None:
    benchmark = load_script("benchmarks/convergence.py")
    config = yaml.safe_load((REPO / "configs" / "demo_shapes_cpu.yaml").read_text())
    run = benchmark.build_run_config("demo", [])
    model = dict(config["model"])
    for name, value in model.pop("detr").items():
        assert getattr(run.detr, name) == value, name
    settings = {**model["loss"], **model["optimizer"], **model["runtime"]}  # the training settings, flat
    settings.pop("lr_drop_epochs")
    assert run.system == settings
    assert (run.batch_size, run.clip, run.seed) == (config["data"]["batch_size"],
                                                    config["trainer"]["gradient_clip_val"], config["seed_everything"])
    assert benchmark.demo_image_size() == config["data"]["train_max_size"]
    # --set still overrides it, and the run's seed follows --seeds
    assert benchmark.build_run_config("demo", ["lr=1e-3", "seed=1"]).system["lr"] == 1e-3


def test_seeds_print_ap50_at_the_report_steps(tmp_path, capsys) -> None:
    benchmark = load_script("benchmarks/convergence.py")
    argv = ["--preset", "demo", *(f"--set={item}" for item in TINY), "--seeds", "0", "1", "--train-steps", "4",
            "--eval-every-steps", "2", "--report-steps", "2", "4", "--num-train", "4", "--num-val", "2",
            "--cache-dir", str(tmp_path), "--threads", "1"]
    assert benchmark.main(argv) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "shapes_4_2_0").is_dir() and (tmp_path / "shapes_4_2_1").is_dir()  # the generator's seeds
    for seed in (0, 1):
        steps = re.findall(rf"\[demo seed {seed}\] train .* step +(\d+)/4 .* AP50 [0-9.]+", out)
        assert steps == ["2", "4"]
        assert re.search(rf"^ +{seed} \| +[0-9.]+ \| +[0-9.]+ \| [0-9.]+$", out, re.MULTILINE), out


def test_a_yaml_preset_is_what_detr_fit_trains_from_that_file() -> None:
    """``--preset configs/rtdetr_shapes_cpu.yaml``: the file's whole recipe as ``detr fit`` resolves it (its
    include of the demo YAML and its dotted keys), with the family's input contract."""
    benchmark = load_script("benchmarks/convergence.py")
    path = REPO / "configs" / "rtdetr_shapes_cpu.yaml"
    run = benchmark.build_run_config(str(path), ["lr=1e-3"])
    assert (run.detr.family, run.detr.backbone, run.detr.num_feature_levels) == ("rtdetr", "resnet18", 3)
    assert (run.square_size, run.normalize, run.batch_size, run.clip) == (128, False, 8, 0.1)
    assert run.system["lr"] == 1e-3 and run.system["lr_decay_fraction"] == 0.3  # --set over the demo's value
    assert "evaluation_dir" not in run.system and "init_checkpoint" not in run.system
    assert benchmark.yaml_image_size(path) == 128
    with pytest.raises(SystemExit, match="no such file"):
        benchmark.build_run_config("configs/missing.yaml", [])


def test_a_yaml_preset_run_saves_a_model_that_loads_with_its_input_contract(tmp_path, capsys) -> None:
    """``--save-dir``: the trained RT-DETR is written as ``detr fit`` writes it, and loads back with the
    family's square contract at the run's size and the data's categories."""
    from detr import load_checkpoint

    benchmark = load_script("benchmarks/convergence.py")
    argv = ["--preset", str(REPO / "configs" / "rtdetr_shapes_cpu.yaml"), *(f"--set={item}" for item in TINY),
            "--train-steps", "2", "--eval-every-steps", "2", "--num-train", "4", "--num-val", "2",
            "--cache-dir", str(tmp_path), "--threads", "1", "--save-dir", str(tmp_path / "models")]
    assert benchmark.main(argv) == 0
    assert re.search(r"\[rtdetr_shapes_cpu\] train .* step +2/2 .* AP50 [0-9.]+", capsys.readouterr().out)
    model = load_checkpoint(tmp_path / "models" / "rtdetr_shapes_cpu.ckpt")
    assert (model.config.family, model.input_spec.resize, model.input_spec.size) == ("rtdetr", "square", 128)
    assert model.input_spec.mean is None and len(model.meta.category_map.names) == 5


def test_a_run_keeps_a_model_at_each_ap_it_reaches_and_ends_when_all_are_kept(tmp_path) -> None:
    """``save_at_ap`` (benchmarks/finetune.py's ``--source-ap``, sources of one quality): the model is written at the
    first evaluation whose AP reaches each target; a run that reaches every target ends there, one that does not
    trains to its last step without writing the unreached one."""
    from detr import load_checkpoint

    benchmark = load_script("benchmarks/convergence.py")
    config = benchmark.build_run_config("demo", TINY)
    root = benchmark.shapes_root(4, 2, 0, tmp_path)
    reached, unreached = tmp_path / "ap0.ckpt", tmp_path / "ap2.ckpt"
    curve = benchmark.run(config, root, minutes=60.0, eval_every=0.0, name="source", jsonl=None, max_steps=6,
                          eval_every_steps=2, save_at_ap={0.0: reached, 2.0: unreached})
    assert [point["step"] for point in curve] == [2, 4, 6] and not unreached.exists()
    assert len(load_checkpoint(reached).meta.category_map.names) == 5
    reached.unlink()
    curve = benchmark.run(config, root, minutes=60.0, eval_every=0.0, name="source", jsonl=None, max_steps=6,
                          eval_every_steps=2, save_at_ap={0.0: reached})
    assert [point["step"] for point in curve] == [2] and reached.is_file()
