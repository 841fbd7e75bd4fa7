"""The explorer's HTML: one self-contained page per image (template, CSS, script and data inline, from
``explorer_template.html``, ``explorer.css`` and ``explorer.js`` in :mod:`detr.visualize`), and an index page."""

from __future__ import annotations

import base64
import html
import io
import json
import re
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

from PIL import Image

from detr.visualize.explorer.data import DATA_FORMAT

_TEMPLATE_FIELDS = re.compile(r"__EXPLORER_(TITLE|STYLE|SCRIPT|DATA)__")


def _asset(name: str) -> str:
    return resources.files("detr.visualize").joinpath(name).read_text(encoding="utf-8")


def _script_safe_json(data: Mapping[str, Any]) -> str:
    # "<", ">" and "&" only occur inside JSON strings, where \u escapes are equivalent; this keeps a
    # title like "</script>" from ending the data block.
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_explorer_html(data: Mapping[str, Any]) -> str:
    """One self-contained HTML page (template, CSS, script and ``data`` inline) for :func:`explorer_data`."""
    if data.get("format") != DATA_FORMAT:
        raise ValueError(
            f"data['format'] must be {DATA_FORMAT!r} (build it with explorer_data), got {data.get('format')!r}"
        )
    values = {
        "TITLE": html.escape(str(data["title"])),
        "STYLE": _asset("explorer.css"),
        "SCRIPT": _asset("explorer.js"),
        "DATA": _script_safe_json(data),
    }
    # One pass, so text inside the data can never be taken for a placeholder.
    return _TEMPLATE_FIELDS.sub(lambda match: values[match.group(1)], _asset("explorer_template.html"))


def render_index_html(pages: Sequence[tuple[str, Mapping[str, Any]]], *, title: str = "DETR attention explorer") -> str:
    """An index page linking to several explorer pages.

    Args:
        pages: ``(relative link, explorer data)`` per page; the data gives the thumbnail and detections.
    """
    cards = []
    for link, data in pages:
        threshold = float(data["threshold"])
        detected = [
            f"{html.escape(data['class_names'][label])} {score:.2f}"
            for score, label in sorted(zip(data["scores"], data["labels"]), reverse=True)
            if score >= threshold
        ]
        summary = ", ".join(detected) if detected else f"no query scores ≥ {threshold:g}"
        cards.append(
            f'<a class="card" href="{html.escape(link, quote=True)}">'
            f'<img src="{_thumbnail(data["image"]["src"])}" alt="">'
            f'<span class="name">{html.escape(str(data["title"]))}</span>'
            f'<span class="detail">{len(detected)} detections: {summary}</span></a>'
        )
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<link rel="icon" href="data:,">\n'
        f"<title>{html.escape(title)}</title>\n<style>\n"
        "body{font-family:system-ui,sans-serif;margin:16px;background:#f7f7f5;color:#1d1d1f}"
        "h1{font-size:18px}.cards{display:flex;flex-wrap:wrap;gap:12px}"
        ".card{display:flex;flex-direction:column;width:240px;text-decoration:none;color:inherit;"
        "background:#fff;border:1px solid #d7d7d2;border-radius:4px;padding:6px}"
        ".card:hover{border-color:#e8590c}.card img{width:100%;height:auto}.name{font-weight:600;margin-top:4px}"
        ".detail{color:#6b6b70;font-size:12px}\n</style>\n</head>\n<body>\n"
        f"<h1>{html.escape(title)}</h1>\n<div class=\"cards\">\n" + "\n".join(cards) + "\n</div>\n</body>\n</html>\n"
    )


def _thumbnail(data_uri: str, *, width: int = 240) -> str:
    payload = base64.b64decode(data_uri.split(",", 1)[1])
    with Image.open(io.BytesIO(payload)) as image:
        image = image.convert("RGB")
        image.thumbnail((width, width * 4))
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=80)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
