"""Parity against Hugging Face transformers for Grounding DINO at the released models' sizes.

    .venv/bin/python benchmarks/huggingface_grounding_parity.py [--height 320 --width 480] [--threads 2]

A transformers ``GroundingDinoForObjectDetection`` of Grounding DINO-T's size (Swin-T, 256 wide, 6 + 6 layers,
900 queries, 256 text tokens) with a 2-layer BERT of width 256 and random weights (those of the tests'
``randomise``) is saved with ``save_pretrained`` and read by :func:`detr.load_checkpoint`;
both run on two random images (the second padded) and the tests' two prompts. Printed: the max abs differences
of the encoder outputs, the proposals' logits, the final logits and boxes, the selected slots that differ (the
order of near-tied proposals: docs/models/grounding.md), and the final differences given transformers'
selection. Needs transformers.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.helpers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--height", type=int, default=320)
    parser.add_argument("--width", type=int, default=480)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import transformers

    from detr.checkpoints import load_checkpoint
    from tests.helpers_grounding import PROMPTS, write_directory

    swin = transformers.SwinConfig(embed_dim=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24], window_size=7,
                                   out_indices=[2, 3, 4])
    sizes = dict(d_model=256, encoder_layers=6, decoder_layers=6, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
                 encoder_attention_heads=8, decoder_attention_heads=8, encoder_n_points=4, decoder_n_points=4,
                 num_queries=900, max_text_len=256)
    with tempfile.TemporaryDirectory() as folder:
        theirs = write_directory(Path(folder) / "model", "gdino", backbone_config=swin, text_width=256, **sizes)
        ours = load_checkpoint(Path(folder) / "model")
        text = ours.tokenizer(PROMPTS, padding="longest", return_tensors="pt")
    images = torch.randn(2, 3, args.height, args.width, generator=torch.Generator().manual_seed(0))
    mask = torch.zeros(2, args.height, args.width, dtype=torch.bool)
    mask[1, args.height * 3 // 4:] = True
    mask[1, :, args.width * 5 // 6:] = True
    with torch.no_grad():
        expected = theirs(pixel_values=images, pixel_mask=(~mask).long(), **text)
        got = ours(images, mask, text["input_ids"], text["attention_mask"], text["token_type_ids"])
        finite = expected.logits.isfinite()
        print(f"logits {(got.logits[finite] - expected.logits[finite]).abs().max():.2e}, "
              f"boxes {(got.boxes - expected.pred_boxes).abs().max():.2e}")
        proposals = got.proposals.logits
        ok = expected.enc_outputs_class.isfinite()
        print(f"proposal logits {(proposals[ok] - expected.enc_outputs_class[ok]).abs().max():.2e}")
        selected = [scores.max(-1).values.topk(sizes["num_queries"], dim=1).indices
                    for scores in (proposals, expected.enc_outputs_class)]
        print("selected slots that differ per image:", (selected[0] != selected[1]).sum(1).tolist())
        head = ours.transformer.enc_out_class_embed
        own = head.forward
        head.forward = lambda queries, text_, mask_: (
            expected.enc_outputs_class if queries.shape[1] == proposals.shape[1] else own(queries, text_, mask_))
        given = ours(images, mask, text["input_ids"], text["attention_mask"], text["token_type_ids"])
        logits = (given.logits[finite] - expected.logits[finite]).abs().max()
        print(f"given transformers' selection: logits {logits:.2e}, "
              f"boxes {(given.boxes - expected.pred_boxes).abs().max():.2e}")


if __name__ == "__main__":
    main()
