"""HTML building blocks of the report: number formatting, tables, the page's CSS and its
self-check script. Kept apart from ``report.py`` so the page's look is in one place."""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

PERCENT_COLUMNS = frozenset({"gpu_utilization", "idle_fraction", "fraction"})

CSS = """
body { font-family: -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif;
       margin: 24px auto; max-width: 1320px; padding: 0 16px; color: #1a1a1a; line-height: 1.45; }
h1 { font-size: 24px; margin-bottom: 4px; }
h2 { font-size: 19px; border-bottom: 2px solid #0072B2; padding-bottom: 3px; margin-top: 32px; }
h3 { font-size: 15px; margin: 18px 0 6px; }
h4 { font-size: 13px; margin: 8px 0 4px; }
table { border-collapse: collapse; font-size: 12.5px; margin: 8px 0 12px; }
th, td { border: 1px solid #d6d6d6; padding: 3px 7px; }
th { background: #eef3f8; text-align: left; position: sticky; top: 0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr:nth-child(even) td { background: #fafafa; }
.scroll { overflow-x: auto; max-width: 100%; }
figure { margin: 10px 0; }
img { max-width: 100%; height: auto; border: 1px solid #eee; }
.note { color: #555; font-size: 12.5px; }
.warn { color: #a33; }
ul.story li { margin: 4px 0; }
details { margin: 6px 0; }
summary { cursor: pointer; font-weight: 600; }
.cols { display: flex; gap: 24px; flex-wrap: wrap; align-items: flex-start; }
code { background: #f3f3f3; padding: 0 3px; border-radius: 3px; }
"""

# Marks the page once every image decoded: tests read data-images-ok from the DOM.
SCRIPT = """
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.every(function (i) { return i.complete && i.naturalWidth > 0; });
  document.documentElement.setAttribute('data-images-ok', ok ? 'true' : 'false');
  document.documentElement.setAttribute('data-images', String(imgs.length));
});
"""


def fmt_value(v: Any, *, digits: int = 3, percent: bool = False) -> tuple[str, bool]:
    """Text of a cell and whether it is numeric (right-aligned)."""
    if v is None:
        return "–", False
    if isinstance(v, bool | np.bool_):
        return ("yes" if v else "no"), False
    if isinstance(v, int | np.integer):
        return f"{int(v):,}", True
    if isinstance(v, float | np.floating):
        x = float(v)
        if math.isnan(x):
            return "–", True
        if percent:
            return f"{x * 100:.1f}%", True
        if x != 0 and abs(x) >= 1000:
            return f"{x:,.0f}", True
        if x.is_integer():
            return f"{x:.0f}", True
        return f"{x:.{digits}g}", True
    return str(v), False


def fmt_table(df: pd.DataFrame, *, digits: int = 3, percent: Iterable[str] = ()) -> str:
    pct = PERCENT_COLUMNS | set(percent)
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    rows = []
    for rec in df.itertuples(index=False, name=None):
        cells = []
        for col, v in zip(df.columns, rec, strict=True):
            text, num = fmt_value(v, digits=digits, percent=col in pct)
            cls = " class='num'" if num else ""
            cells.append(f"<td{cls}>{html.escape(text)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f"<div class='scroll'><table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"


def kv_table(d: dict[str, Any]) -> str:
    rows = []
    for k, v in d.items():
        if isinstance(v, dict | list):
            text, num = json.dumps(v, default=str), False
        else:
            text, num = fmt_value(v, digits=6)
        cls = " class='num'" if num else ""
        rows.append(f"<tr><th>{html.escape(str(k))}</th><td{cls}>{html.escape(text)}</td></tr>")
    return f"<table>{''.join(rows)}</table>"
