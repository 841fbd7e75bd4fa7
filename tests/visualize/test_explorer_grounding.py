"""detr-explore --prompt: a Grounding DINO page shows, per query, its decoder attention over the prompt's
tokens beside its sampling points in the image. On a real photo with the tiny random model: the page holds the
tokens and phrases, and its weights are softmax weights (1 per layer, query and head) equal to the attention that
a forward hook recomputes from the text cross-attention's own inputs and projections."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import torch

from detr.commands import explore
from detr.visualize.explorer.data import WEIGHT_UNITS
from tests.helpers import REPO, read_sampling_page

PHOTO = REPO / "data" / "photos" / "000000039769.png"
PROMPT = "a cat. a remote control."

pytestmark = pytest.mark.usefixtures("one_thread")


def _text_weights(data: dict) -> np.ndarray:
    """The page's text attention decoded as its script decodes it: [L, Q, heads, N]."""
    text = data["text"]
    return np.frombuffer(base64.b64decode(text["weights"]), "<u2").reshape(text["shape"]) / WEIGHT_UNITS


def _recomputed_text_attention(model) -> list[torch.Tensor]:
    """Each decoder layer's text cross-attention, recomputed by a forward hook from the inputs ``ca_text`` gets
    (query, key, key_padding_mask) and its in_proj: softmax(q kᵀ / √d) per head, [heads, Q, N] for the image."""
    from detr.inference.images import to_rgb_array
    from detr.inference.predictor import Predictor
    from detr.models.inputs import pad_images
    from detr.visualize.explorer.pages import prompt_tokens

    recomputed: list[torch.Tensor] = []

    def hook(module, args, kwargs, _output):
        query, key = args[0], args[1]
        heads, width = module.num_heads, module.embed_dim
        w_q, w_k = module.in_proj_weight[:width], module.in_proj_weight[width:2 * width]
        b_q, b_k = module.in_proj_bias[:width], module.in_proj_bias[width:2 * width]
        q = (query @ w_q.T + b_q).unflatten(-1, (heads, -1)).transpose(1, 2)  # [B, heads, Q, d]
        k = (key @ w_k.T + b_k).unflatten(-1, (heads, -1)).transpose(1, 2)  # [B, heads, N, d]
        scores = q @ k.transpose(-1, -2) / (width // heads) ** 0.5
        scores = scores.masked_fill(kwargs["key_padding_mask"][:, None, None], float("-inf"))
        recomputed.append(scores.softmax(-1)[0].detach())

    predictor = Predictor(model, device="cpu")
    handles = [layer.ca_text.register_forward_hook(hook, with_kwargs=True)
               for layer in model.transformer.decoder.layers]
    try:
        text, _ = prompt_tokens(model.tokenizer, PROMPT, model.num_classes)
        tensor = predictor.preprocess(to_rgb_array(PHOTO))
        predictor.forward(*pad_images([tensor]), text=text)  # without return_attention: the fast path's inputs
    finally:
        for handle in handles:
            handle.remove()
    return recomputed


def test_explore_with_a_prompt_shows_each_query_s_attention_over_the_tokens(grounding_directory, tmp_path, capsys):
    import detr

    assert explore.main([str(PHOTO), "--checkpoint", str(grounding_directory), "--prompt", PROMPT,
                         "--out", str(tmp_path), "--device", "cpu"]) == 0
    page = tmp_path / f"{PHOTO.stem}.html"
    assert str(page) in capsys.readouterr().out
    data = read_sampling_page(page)
    text = data["text"]
    assert text["prompt"] == PROMPT
    assert text["tokens"] == ["[CLS]", "a", "cat", ".", "a", "remote", "control", ".", "[SEP]"]
    assert text["phrases"] == [-1, 0, 0, -1, 1, 1, 1, -1, -1]
    assert text["phrase_names"] == ["a cat", "a remote control"]
    assert data["class_names"][:9] == text["tokens"] and not any(data["class_names"][9:])
    assert "remote" in page.read_text(encoding="utf-8")  # the tokens are in the page itself

    weights = _text_weights(data)  # [L, Q, heads, N]
    model = detr.load_checkpoint(grounding_directory)
    layers, queries, heads = model.config.num_decoder_layers, model.num_queries, model.config.num_heads
    assert weights.shape == (layers, queries, heads, len(text["tokens"]))
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=len(text["tokens"]) / WEIGHT_UNITS)
    recomputed = torch.stack(_recomputed_text_attention(model)).transpose(1, 2).numpy()  # [L, Q, heads, N]
    np.testing.assert_allclose(weights, recomputed, atol=1e-4)
    # the image side is a Deformable DETR's page: sampling points per layer, query, head and level
    assert data["kind"] == "sampling" and data["sampling"]["weights"].shape[:3] == (layers, queries, heads)


def test_the_model_s_text_attention_is_its_softmax_over_the_prompt(grounding_directory):
    """return_attention adds text_attention [L, B, heads, Q, N] and changes no prediction."""
    import detr
    from detr.models.inputs import pad_images

    model = detr.load_checkpoint(grounding_directory)
    text = model.tokenizer(["a cat.", PROMPT], padding="longest", return_tensors="pt")
    images, padding_mask = pad_images([torch.rand(3, 64, 80), torch.rand(3, 48, 72)])[:2]
    with torch.no_grad():
        plain = model(images, padding_mask, text["input_ids"], text["attention_mask"])
        shown = model(images, padding_mask, text["input_ids"], text["attention_mask"], return_attention=True)
    torch.testing.assert_close(shown.logits, plain.logits)
    attention = shown.text_attention
    assert attention.shape == (model.config.num_decoder_layers, 2, model.config.num_heads, model.num_queries,
                               text["input_ids"].shape[1])
    torch.testing.assert_close(attention.sum(-1), torch.ones(attention.shape[:-1]))
    assert (attention[:, 0, :, :, 5:] == 0).all()  # "[CLS] a cat . [SEP]" and padding after it
    assert shown.sampling is not None and shown.sampling.weights.shape[:3] == (model.config.num_decoder_layers, 2,
                                                                                 model.num_queries)


def test_a_prompted_checkpoint_without_a_prompt_is_one_error_line(grounding_directory, tmp_path, capsys):
    with pytest.raises(SystemExit):
        explore.main([str(PHOTO), "--checkpoint", str(grounding_directory), "--out", str(tmp_path)])
    [error] = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert "--prompt" in error and "detects what a text prompt names" in error
    assert not list(tmp_path.glob("*.html"))


def test_a_prompt_goes_with_images_not_a_video(grounding_directory, tmp_path, capsys):
    with pytest.raises(SystemExit):
        explore.main(["--video", "clip.mp4", "--frame", "1", "--prompt", PROMPT, "--checkpoint",
                      str(grounding_directory), "--out", str(tmp_path)])
    assert "--prompt goes with images" in capsys.readouterr().err
