"""The key-mapping engine every checkpoint reader and writer is a table over: renames by template with indices and
fields, q/k/v fuse and split, dropped keys, buffers checked and computed, tied copies and modules, one error for
unmapped keys."""

from __future__ import annotations

import pytest
import torch

from detr.checkpoints.formats import CheckpointError, ExportError
from detr.checkpoints.key_map import Buffer, Drop, Field, Fuse, KeyMap, Rename, Tied, refuse_unless

TABLE = KeyMap(
    "toy",
    renames=(
        Rename("model.stem.{stem}.{cn}.", "backbone.conv1_{stem}.{cn}."),
        Rename("model.layers.{}.fc{}.", "decoder.layers.{}.linear{}."),
        Rename("model.layers.{}.self_attn.out_proj.", "decoder.layers.{}.self_attn.out_proj."),
        Rename("model.head.", "head."),
        Rename("copy_of_head.", "head."),
    ),
    fields={"stem": Field.shifted(1), "cn": Field.named({"convolution": "conv", "normalization": "norm"})},
    fuse=(Fuse("model.layers.{}.self_attn.", "decoder.layers.{}.self_attn."),),
    drop=(Drop(r".*num_batches_tracked$", "recomputed by batch norm", side="both"),),
    buffers=(Buffer("model.layers.{}.scale", "decoder.layers.{}.linear1.weight",
                    lambda points: torch.full((points,), 1.0 / points), "1 / points"),),
    read_spelling=((r"\.o_proj\.", ".out_proj."),),
)


def ours(layers: int = 2, width: int = 4) -> dict[str, torch.Tensor]:
    state = {"backbone.conv1_1.conv.weight": torch.randn(3, 3), "backbone.conv1_2.norm.bias": torch.randn(3),
             "head.weight": torch.randn(2, width)}
    for layer in range(layers):
        state.update({f"decoder.layers.{layer}.linear1.weight": torch.randn(8, width),
                      f"decoder.layers.{layer}.linear2.bias": torch.randn(width),
                      f"decoder.layers.{layer}.self_attn.in_proj_weight": torch.randn(3 * width, width),
                      f"decoder.layers.{layer}.self_attn.in_proj_bias": torch.randn(3 * width),
                      f"decoder.layers.{layer}.self_attn.out_proj.weight": torch.randn(width, width)})
    return state


def test_renames_carry_indices_and_fields_both_ways():
    assert TABLE.our_key("model.stem.0.convolution.weight") == "backbone.conv1_1.conv.weight"
    assert TABLE.our_key("model.stem.1.normalization.running_mean") == "backbone.conv1_2.norm.running_mean"
    assert TABLE.our_key("model.layers.3.fc2.bias") == "decoder.layers.3.linear2.bias"
    assert TABLE.their_key("backbone.conv1_3.norm.weight") == "model.stem.2.normalization.weight"
    assert TABLE.their_key("head.bias") == "model.head.bias"  # the first rule wins, not the copy's
    assert TABLE.our_key("model.unknown.weight") is None and TABLE.their_key("unknown") is None


def test_a_written_state_dict_reads_back_the_same():
    state = ours()
    theirs = TABLE.to_theirs(state, context=2)
    assert "decoder.layers.0.self_attn.in_proj_weight" not in theirs
    assert [key for key in theirs if "self_attn" in key][:3] == [
        f"model.layers.0.self_attn.{part}_proj.weight" for part in "qkv"]  # split in place
    assert torch.equal(theirs["model.layers.1.self_attn.k_proj.bias"],
                       state["decoder.layers.1.self_attn.in_proj_bias"][4:8])
    assert torch.equal(theirs["model.layers.1.scale"], torch.tensor([0.5, 0.5]))  # computed per layer
    assert all(value.is_contiguous() for value in theirs.values())
    back = TABLE.to_ours(theirs, "toy.safetensors", context=2)
    assert back.keys() == state.keys()
    assert all(torch.equal(back[key], value) for key, value in state.items())


def test_spellings_drops_halves_and_tied_copies_are_read():
    theirs = TABLE.to_theirs(ours(layers=1), context=2)
    theirs = {key.replace(".out_proj.", ".o_proj."): value.half() for key, value in theirs.items()}
    theirs["model.stem.0.normalization.num_batches_tracked"] = torch.tensor(3)
    theirs["copy_of_head.weight"] = theirs["model.head.weight"].clone()
    read = TABLE.to_ours(theirs, "toy.safetensors", context=2)
    assert read["decoder.layers.0.self_attn.out_proj.weight"].dtype == torch.float32
    assert not any("num_batches_tracked" in key for key in read)


def test_keys_that_map_nowhere_are_named_with_the_file():
    theirs = {**TABLE.to_theirs(ours(), context=2), "model.extra.weight": torch.zeros(1),
              "other.bias": torch.zeros(1)}
    with pytest.raises(CheckpointError, match=r"toy\.safetensors: 2 keys have no counterpart in this project's "
                                              r"toy \(not transformers' toy\?\): \['model\.extra\.weight', "
                                              r"'other\.bias'\]") as error:
        TABLE.to_ours(theirs, "toy.safetensors", context=2)
    assert "\n" not in str(error.value)
    with pytest.raises(ExportError, match="unknown.weight has no counterpart in transformers' toy"):
        TABLE.to_theirs({"unknown.weight": torch.zeros(1)})


def test_incomplete_projections_disagreeing_buffers_and_copies_are_refused():
    theirs = TABLE.to_theirs(ours(layers=1), context=2)
    without_v = {key: value for key, value in theirs.items() if "v_proj.weight" not in key}
    with pytest.raises(CheckpointError, match=r"decoder\.layers\.0\.self_attn has only the \['k', 'q'\]"):
        TABLE.to_ours(without_v, "toy", context=2)
    with pytest.raises(CheckpointError, match=r"model\.layers\.0\.scale is not 1 / points"):
        TABLE.to_ours(theirs, "toy", context=4)
    with pytest.raises(CheckpointError, match=r"model\.head\.weight and copy_of_head\.weight hold different"):
        TABLE.to_ours({**theirs, "copy_of_head.weight": torch.ones(2, 4)}, "toy", context=2)


def test_a_table_whose_directions_disagree_is_caught_when_writing():
    shadowed = KeyMap("a wrong table", renames=(Rename("model.", "body."), Rename("model.head.", "head.")))
    with pytest.raises(AssertionError, match="reads back as body.head.weight"):
        shadowed.to_theirs({"head.weight": torch.zeros(1)})


def test_refuse_unless_names_the_file_and_every_differing_setting():
    refuse_unless({"act": "relu", "sizes": [1, 2], "unset": None}, {"act": "relu", "sizes": (1, 2), "unset": 3},
                  "config.json", "toy")
    with pytest.raises(CheckpointError, match=r"config\.json: this project's toy has a backbone with .*the file sets "
                                              r"\{'act': 'gelu'\}, which it cannot reproduce"):
        refuse_unless({"act": "gelu"}, {"act": "relu"}, "config.json", "toy", "a backbone with")


def test_a_family_that_writes_its_own_spelling_reads_it_back():
    """DEIMv2's files spell the output projections ``o_proj``: written so, read through ``read_spelling``."""
    spelled = KeyMap("toy", TABLE.renames, fields=TABLE.fields, fuse=TABLE.fuse, read_spelling=TABLE.read_spelling,
                     write_spelling=((r"\.out_proj\.", ".o_proj."),))
    state = ours(layers=1)
    theirs = spelled.to_theirs(state)
    assert "model.layers.0.self_attn.o_proj.weight" in theirs and not any(".out_proj." in key for key in theirs)
    assert spelled.to_ours(theirs, "toy").keys() == state.keys()


def test_tied_modules_a_file_leaves_out_are_copies_of_the_first():
    """transformers ties Deformable DETR's per-layer class heads to the first unless they differ: a file may hold
    only ``class_embed.0``, and reads as that head at every layer."""
    tied = KeyMap("toy", (Rename("class_embed.", "class_embed."),),
                  tied=(Tied("class_embed.{}.", lambda layers: layers, "a model without the heads?"),))
    first, third = torch.randn(3, 4), torch.randn(3, 4)
    read = tied.to_ours({"class_embed.0.weight": first, "class_embed.2.weight": third}, "toy", context=3)
    assert torch.equal(read["class_embed.1.weight"], first) and torch.equal(read["class_embed.2.weight"], third)
    with pytest.raises(CheckpointError, match=r"toy has no class_embed\.0: a model without the heads\?"):
        tied.to_ours({"class_embed.1.weight": first}, "toy", context=3)
