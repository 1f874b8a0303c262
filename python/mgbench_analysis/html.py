"""One static index.html with the figures and the report tables, for sharing a run matrix."""
from __future__ import annotations

import datetime
import html
import os
from typing import Sequence, Tuple

import pandas as pd

from .report import report_table

_STYLE = """body{font-family:sans-serif;margin:2em;max-width:1400px}
table{border-collapse:collapse;font-size:0.85em;margin-bottom:2em}
th,td{border:1px solid #ccc;padding:2px 6px;text-align:right}th{background:#eee}
figure{margin:0 0 2.5em 0}img{max-width:100%;border:1px solid #ddd}
.skipped{color:#777}"""


def write_index(directory: str, runs: pd.DataFrame, figures: Sequence[Tuple[str, str, str]],
                skipped: Sequence[Tuple[str, str]], sources: Sequence[str]) -> str:
    """Writes `directory`/index.html: the figures (title, file name relative to the directory, name),
    a line per skipped figure with what it needs, and the `mgbench report --csv` tables of the runs.
    Returns the page's path."""
    parts = ["<!DOCTYPE html>", "<html lang=\"en\"><head><meta charset=\"utf-8\">",
             "<title>mgbench results</title>", f"<style>{_STYLE}</style></head><body>",
             "<h1>mgbench results</h1>",
             f"<p>{len(runs)} run(s) from {len(sources)} file(s), written "
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC by mgbench-plot.</p>",
             "<ul>" + "".join(f"<li><code>{html.escape(s)}</code></li>" for s in sources) + "</ul>",
             "<h2>Figures</h2>"]
    for title, file_name, name in figures:
        parts.append(f"<figure id=\"{html.escape(name)}\"><figcaption><h3>{html.escape(title)}</h3></figcaption>"
                     f"<img src=\"{html.escape(file_name)}\" alt=\"{html.escape(title)}\"></figure>")
    if skipped:
        parts.append("<h3>Figures without data</h3><ul class=\"skipped\">")
        parts += [f"<li>{html.escape(name)}: needs {html.escape(needs)}</li>" for name, needs in skipped]
        parts.append("</ul>")
    parts.append("<h2>Report tables</h2>")
    for table, title in (("image", "Image runs (mgbench report)"), ("llm", "LLM runs"), ("dpo", "DPO runs")):
        frame = report_table(runs, table)
        if frame.empty:
            continue
        frame = frame.drop(columns=["file"])
        parts.append(f"<h3>{title}</h3>")
        parts.append(frame.to_html(index=False, na_rep="-", float_format=lambda v: f"{v:.4g}", escape=True))
    parts.append("</body></html>")
    path = os.path.join(directory, "index.html")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(parts) + "\n")
    return path
