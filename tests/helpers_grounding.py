"""Tiny random transformers Grounding DINO and MM-Grounding-DINO directories for the grounding tests (no download:
the tokenizer's vocabulary is written here)."""

from __future__ import annotations

import torch
import transformers

from tests.helpers import randomise

TOLERANCE = 1e-4
PROMPTS = ["a cat. a remote control.", "two dogs?"]
WORDS = ["a", "cat", "remote", "control", "two", "dog", "##s", "the", "cats", "couch"]
TINY = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
            encoder_attention_heads=4, decoder_attention_heads=4, encoder_n_points=2, decoder_n_points=2,
            num_queries=12, max_text_len=24, dropout=0.0, fusion_droppath=0.0)


def vocabulary() -> dict[str, int]:
    """A WordPiece vocabulary with bert-base-uncased's ids for the tokens the model reads ([PAD] 0, [UNK] 100,
    [CLS] 101, [SEP] 102, [MASK] 103, "." 1012, "?" 1029), a few words, and fillers in between."""
    tokens = [f"[unused{i}]" for i in range(1040)]
    for index, token in {0: "[PAD]", 100: "[UNK]", 101: "[CLS]", 102: "[SEP]", 103: "[MASK]", 1012: ".",
                         1029: "?"}.items():
        tokens[index] = token
    for index, word in enumerate(WORDS, start=1030):
        tokens[index] = word
    return {token: index for index, token in enumerate(tokens)}


def write_directory(directory, family: str, *, seed: int = 0, image_size: tuple[int, int] | None = None,
                    text_width: int = 32, **options):
    """A tiny random transformers (MM-)Grounding DINO ("gdino" or "mm") with a ResNet-18 and a one-layer BERT,
    saved with its processor (tokenizer from a written vocabulary; its resize (shortest, longest) side
    ``image_size``, default transformers' 800 / 1333); ``text_width``: the BERT's; ``options``: config fields over
    :data:`TINY` (``backbone_config`` a transformers backbone config instead of the ResNet-18); returns the
    transformers model."""
    resnet = options.pop("backbone_config", None) or transformers.ResNetConfig(
        layer_type="basic", depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512],
        out_features=["stage2", "stage3", "stage4"])
    tiny_text = text_width == 32  # one layer of 2 heads; wider: 2 layers of 4 heads
    bert = transformers.BertConfig(vocab_size=1040, hidden_size=text_width, num_hidden_layers=1 if tiny_text else 2,
                                   num_attention_heads=2 if tiny_text else 4,
                                   intermediate_size=37 if tiny_text else 2 * text_width, max_position_embeddings=64)
    sizes = {**TINY, **options}
    if family == "mm":
        config = transformers.MMGroundingDinoConfig(backbone_config=resnet, text_config=bert, **sizes)
        model = transformers.MMGroundingDinoForObjectDetection(config)
    else:
        config = transformers.GroundingDinoConfig(backbone_config=resnet, text_config=bert, **sizes)
        model = transformers.GroundingDinoForObjectDetection(config)
    randomise(model, seed)
    generator = torch.Generator().manual_seed(seed)  # the same directory in every process
    with torch.no_grad():  # the fusion's gains start at 1e-4: make the fusion count (the text's less, as the
        for name, parameter in model.named_parameters():  # image's mean would make every token alike)
            if name.endswith("vision_param"):
                parameter.uniform_(0.5, 1.5, generator=generator)
            elif name.endswith("text_param"):
                parameter.uniform_(0.05, 0.15, generator=generator)
    model.eval().save_pretrained(directory)
    tokenizer = transformers.BertTokenizerFast(vocab=vocabulary(), do_lower_case=True)
    image_processor = transformers.GroundingDinoImageProcessor()
    if image_size is not None:
        image_processor.size = {"shortest_edge": image_size[0], "longest_edge": image_size[1]}
    processor = transformers.GroundingDinoProcessor(image_processor, tokenizer)
    processor.save_pretrained(directory)
    return model


def swin_config():
    """A tiny Swin Transformer putting out stage2–stage4 (channels 32, 64, 128), the released models' backbone."""
    return transformers.SwinConfig(embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 2, 2], window_size=4,
                                   out_indices=[2, 3, 4])
