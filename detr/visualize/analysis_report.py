"""One self-contained HTML page per evaluation: why the detector fails.

:func:`write_analysis_report` writes into ``out_dir``:

    report.html                 summary AP, error breakdown, PR curves, per-class table, confusion matrix,
                                worst cases; the figures are embedded as data URIs, so the page opens
                                offline and can be moved or mailed alone
    analysis.json               the numbers (DetectionAnalysis.to_dict())
    errors.png                  TIDE's dAP per error type
    pr_curves.png               precision-recall over all classes at IoU 0.5 and 0.75
    pr_curves_per_class.png     one small plot per class
    confusion_matrix.png        heat map with background row and missed column
    worst_<type>.png            crops of the most confident errors of each type (needs images_dir)
"""

from __future__ import annotations

import base64
import html
import json
import logging
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from detr.evaluation.analysis import COCO_STAT_NAMES, DetectionAnalysis, worst_cases
from detr.evaluation.tide import ERROR_DESCRIPTIONS, ERROR_NAMES, ERROR_TYPES, SPECIAL_ERRORS
from detr.visualize.analysis_figures import (
    ERROR_COLORS,
    case_title,
    class_pr_curves_figure,
    confusion_matrix_figure,
    error_breakdown_figure,
    gallery_figure,
    pr_curve_figure,
)

logger = logging.getLogger(__name__)

_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 1200px; padding: 0 16px 40px; color: #222; }
h1 { margin-bottom: 0; } h1 small { color: #666; font-weight: normal; font-size: 60%; }
nav a { margin-right: 12px; }
table { border-collapse: collapse; margin: 8px 0 16px; }
th, td { padding: 2px 8px; border-bottom: 1px solid #ddd; text-align: right; white-space: nowrap; }
th { background: #f3f3f3; position: sticky; top: 0; }
td.name, th.name, td:last-child { text-align: left; }
.figure { max-width: 100%; border: 1px solid #eee; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 4px; }
.note { color: #8a5a00; } .muted { color: #888; }
.scroll { overflow: auto; max-height: 640px; }
td.diag { background: #e3f1e3; } td.off { background: #fbe3e3; }
"""


def _percent(value: float) -> str:
    return "–" if value is None or value < 0 else f"{100 * value:.1f}"


def _png_data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _image(path: Path, alt: str) -> str:
    return f'<img class="figure" src="{_png_data_uri(path)}" alt="{html.escape(alt)}" title="{html.escape(path.name)}">'


def _table(header: Iterable[str], rows: Iterable[Iterable[str]], *, name_columns: int = 1) -> str:
    def cells(values: Iterable[str], tag: str) -> str:
        return "".join(f'<{tag}{" class=name" if i < name_columns else ""}>{v}</{tag}>' for i, v in enumerate(values))

    body = "\n".join(f"<tr>{cells(row, 'td')}</tr>" for row in rows)
    return f"<table>\n<tr>{cells(header, 'th')}</tr>\n{body}\n</table>"


def analysis_figures(analysis: DetectionAnalysis) -> dict[str, Figure]:
    """The report's figures without the image gallery, by file stem (also what TensorBoard gets)."""
    return {
        "errors": error_breakdown_figure(analysis.errors),
        "pr_curves": pr_curve_figure(analysis),
        "pr_curves_per_class": class_pr_curves_figure(analysis),
        "confusion_matrix": confusion_matrix_figure(analysis.confusion),
    }


def write_analysis_report(
    analysis: DetectionAnalysis,
    out_dir: str | Path,
    *,
    images_dir: str | Path | None = None,
    title: str = "Detection error analysis",
    gallery_size: int = 8,
    figures: dict[str, Figure] | None = None,
    dpi: int = 100,
) -> Path:
    """Write the figures, ``analysis.json`` and ``report.html`` into ``out_dir`` (created); return the page.

    images_dir: folder holding the ground truth's ``file_name``s, for the worst-case crops (skipped
        without it; cases whose image is missing are skipped and listed on the page).
    figures: already drawn :func:`analysis_figures` (e.g. those logged to TensorBoard), else drawn here.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "analysis.json").write_text(json.dumps(analysis.to_dict(), indent=1) + "\n")
    figures = figures if figures is not None else analysis_figures(analysis)
    paths = {}
    for name, figure in figures.items():
        paths[name] = out / f"{name}.png"
        figure.savefig(paths[name], dpi=dpi)
    notes: list[str] = []
    galleries: dict[str, Path] = {}
    if images_dir is None:
        notes.append("No images folder was given: worst cases are listed, not drawn.")
    else:
        missing_total: list[str] = []
        for error_type in ERROR_TYPES:
            figure, missing = gallery_figure(worst_cases(analysis, error_type, gallery_size), images_dir)
            missing_total += missing
            if figure is not None:
                galleries[error_type] = out / f"worst_{error_type}.png"
                figure.savefig(galleries[error_type], dpi=dpi)
        if missing_total:
            names = sorted(set(missing_total))
            notes.append(f"{len(names)} image(s) not found under {html.escape(str(images_dir))} were skipped: "
                         + html.escape(", ".join(names[:10])) + (" …" if len(names) > 10 else ""))
    page = out / "report.html"
    page.write_text(_render(analysis, title=title, figures=paths, galleries=galleries, notes=notes,
                            gallery_size=gallery_size), encoding="utf-8")
    logger.info("error analysis report: %s", page)
    return page


def _render(analysis: DetectionAnalysis, *, title: str, figures: dict[str, Path], galleries: dict[str, Path],
            notes: list[str], gallery_size: int) -> str:
    errors, confusion = analysis.errors, analysis.confusion
    summary = analysis.to_dict()
    stats = _table(COCO_STAT_NAMES, [[_percent(analysis.stats[n]) for n in COCO_STAT_NAMES]], name_columns=0)

    error_rows = []
    for t in ERROR_TYPES + SPECIAL_ERRORS:
        affected = ", ".join(f"{html.escape(analysis.name_of(c))} {100 * v:.1f}" for c, v in errors.most_affected(t)) \
            if t in ERROR_TYPES else ""
        swatch = f'<span class="swatch" style="background:{ERROR_COLORS[t]}"></span>'
        error_rows.append([swatch + html.escape(ERROR_NAMES[t]), html.escape(ERROR_DESCRIPTIONS[t]),
                           str(errors.counts[t]), f"{100 * errors.delta_ap[t]:.2f}", affected])
    error_table = _table(["error", "definition", "count", "dAP50", "most affected classes (class dAP50)"],
                         error_rows, name_columns=2)

    class_rows = []
    for row in analysis.per_class:
        worst = max(ERROR_TYPES, key=lambda t: row["dAP"][t])
        worst_text = f"{ERROR_NAMES[worst]} ({100 * row['dAP'][worst]:.1f})" if row["dAP"][worst] > 0 else ""
        class_rows.append([html.escape(row["name"]), str(row["category_id"]), str(row["num_gt"]), str(row["num_det"]),
                           _percent(row["AP"]), _percent(row["AP50"]), _percent(row["AP75"]), _percent(row["AR100"]),
                           *[f"{100 * row['dAP'][t]:.1f}" for t in ERROR_TYPES], worst_text])
    class_table = _table(["class", "id", "#gt", "#det", "AP", "AP50", "AP75", "AR100",
                          *[f"d{t}" for t in ERROR_TYPES], "costliest error"], class_rows)

    k = len(confusion.names)
    used = (confusion.matrix[:k].sum(axis=1) + confusion.matrix[:, :k].sum(axis=0)) > 0
    keep = list(np.flatnonzero(used)) + [k]
    labels = [html.escape(confusion.names[i]) for i in keep[:-1]]
    header = ("<tr><th class=name>true \\ predicted</th>" + "".join(f"<th>{n}</th>" for n in labels + ["missed"])
              + "</tr>")
    body = []
    for i, row_name in zip(keep, labels + ["background"]):
        cells = []
        for j in keep:
            value = int(confusion.matrix[i, j])
            kind = "diag" if i == j and i < k else ("off" if value and i < k and j < k else "")
            cells.append(f'<td class="{kind}">{value or ""}</td>')
        body.append(f"<tr><th class=name>{row_name}</th>{''.join(cells)}</tr>")
    confusion_table = f'<div class="scroll"><table>{header}{"".join(body)}</table></div>'
    top_confusions = ", ".join(f"{html.escape(a)} → {html.escape(b)} ({n})" for a, b, n in confusion.confusions(5))

    gallery_html = []
    for t in ERROR_TYPES:
        heading = f"<h3>{html.escape(ERROR_NAMES[t])} <small class=muted>({errors.counts[t]})</small></h3>"
        if t in galleries:
            gallery_html.append(heading + _image(galleries[t], f"worst {ERROR_NAMES[t]} cases"))
        elif errors.counts[t]:
            cases = worst_cases(analysis, t, gallery_size)
            items = "".join(f"<li>{html.escape(c.file_name or str(c.image_id))}: "
                            f"{html.escape(case_title(c).replace(chr(10), ' / '))}</li>" for c in cases)
            gallery_html.append(heading + f"<ul>{items}</ul>")
    note_html = "".join(f'<p class="note">{n}</p>' for n in notes)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="detr.visualize.analysis_report">
<link rel="icon" href="data:,">
<title>{html.escape(title)}</title>
<style>{_STYLE}</style>
</head>
<body>
<header>
<h1>{html.escape(title)} <small>{summary['num_images']} images, {summary['num_objects']} objects,
{summary['num_detections']} detections</small></h1>
<nav><a href="#summary">summary</a><a href="#errors">errors</a><a href="#pr">PR curves</a>
<a href="#classes">per class</a><a href="#confusion">confusion</a><a href="#cases">worst cases</a></nav>
{note_html}
</header>
<section id="summary"><h2>COCO AP (%)</h2>{stats}</section>
<section id="errors">
<h2>Where AP50 is lost</h2>
<p>TIDE (Bolya et al., ECCV 2020): every false positive at IoU t_f = {errors.iou_foreground:g} is sorted by its
overlap with the objects (background threshold t_b = {errors.iou_background:g}); dAP50 is the AP50 after
fixing only that error type, minus the AP50 ({100 * errors.ap:.2f}). The main types do not add up to
100 − AP50: fixing one can reveal another.</p>
{_image(figures['errors'], 'dAP per error type')}
{error_table}
</section>
<section id="pr"><h2>Precision-recall</h2>
{_image(figures['pr_curves'], 'precision-recall over all classes')}
{_image(figures['pr_curves_per_class'], 'precision-recall per class')}
</section>
<section id="classes"><h2>Per class</h2>
<p class=muted>AP columns in %, d&lt;type&gt;: the class's AP50 gained by fixing that error type.</p>
<div class="scroll">{class_table}</div></section>
<section id="confusion"><h2>Confusion matrix</h2>
<p>IoU ≥ {confusion.iou_threshold:g}, detections scoring ≥ {confusion.score_threshold:g}. Rows: true class,
"background" = detections on no free object (false positives). Columns: predicted class, "missed" =
objects no detection found (false negatives). Largest confusions: {top_confusions or 'none'}.</p>
{_image(figures['confusion_matrix'], 'confusion matrix heat map')}
{confusion_table}
</section>
<section id="cases"><h2>Worst cases</h2>
<p class=muted>The most confident detections of each error type (the largest objects for missed ones).</p>
{''.join(gallery_html) or '<p>No errors.</p>'}
</section>
</body>
</html>
"""
