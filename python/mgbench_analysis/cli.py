"""mgbench-plot: every figure the results support, optionally with one index.html page.

    mgbench-plot FILE|DIR|'PATTERN'... --out DIR [--format png|svg|pdf] [--paper] [--html DIR]
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional, Sequence, Tuple

import matplotlib

matplotlib.use("Agg")  # files only: never a display

from . import figures as figs  # noqa: E402
from .html import write_index  # noqa: E402
from .results import ResultsError, expand, read  # noqa: E402


def plot_all(sources, out_dir: str, fmt: str = "png", overlay: bool = False, html_dir: Optional[str] = None,
             log=print) -> Tuple[List[Tuple[str, str]], List[Tuple[str, str]]]:
    """Writes every figure of figures.FIGURES the runs support into `out_dir` as <name>.<fmt>, and with
    `html_dir` an index.html there (with PNG copies of the figures). Logs one line per figure written
    or skipped. Returns ([(name, path)], [(name, what it needs)]).

    Raises results.ResultsError naming the file for input that is not an mgbench results file."""
    files = expand(sources)
    runs = read(files)
    data = figs.Data(runs)
    written, skipped, pages = [], [], []
    for directory in filter(None, (out_dir, html_dir)):
        os.makedirs(directory, exist_ok=True)
    for spec in figs.FIGURES:
        figure = spec.draw(data, overlay)
        if figure is None:
            skipped.append((spec.name, spec.needs))
            log(f"mgbench-plot: skipped {spec.name}: needs {spec.needs}")
            continue
        if out_dir:
            path = os.path.join(out_dir, f"{spec.name}.{fmt}")
            figure.savefig(path, dpi=110)
            written.append((spec.name, path))
            log(f"mgbench-plot: wrote {path}")
        if html_dir:
            page_fmt = "svg" if fmt == "svg" else "png"  # a browser shows no PDF in <img>
            page = os.path.join(html_dir, f"{spec.name}.{page_fmt}")
            if not (out_dir and os.path.samefile(out_dir, html_dir) and page_fmt == fmt):
                figure.savefig(page, dpi=110)
            pages.append((spec.title, f"{spec.name}.{page_fmt}", spec.name))
    if html_dir:
        index = write_index(html_dir, data.runs, pages, skipped, files)
        log(f"mgbench-plot: wrote {index}")
    return written, skipped


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="mgbench-plot",
        description="Figures of Lawenda et al. 2025 (Figs. 1-6, Tables 2-3) and per-run loss, step-time, phase "
                    "and LLM-recipe figures from mgbench results files. A figure without data is skipped with "
                    "a line saying what runs it needs.")
    parser.add_argument("files", nargs="+", metavar="FILE|DIR|PATTERN",
                        help="results files, directories (every *.h5 below) or quoted glob patterns")
    parser.add_argument("--out", metavar="DIR", help="directory for the figures (created)")
    parser.add_argument("--format", choices=("png", "svg", "pdf"), default="png", help="figure format (png)")
    parser.add_argument("--paper", action="store_true",
                        help="overlay the paper's own numbers (Tables 2, 3, 5) as reference points")
    parser.add_argument("--html", metavar="DIR", help="also write DIR/index.html with the figures and report tables")
    args = parser.parse_args(argv)
    if not args.out and not args.html:
        parser.error("give --out DIR, --html DIR or both")
    # Exit 2 for what the user gave (files that are no results, a folder that cannot be written): the
    # message says it; `mgbench report --plot` then gives no install advice, as it does for exit 1.
    try:
        written, _ = plot_all(args.files, args.out, args.format, args.paper, args.html)
    except ResultsError as e:
        print(f"mgbench-plot: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"mgbench-plot: cannot write the figures: {e}", file=sys.stderr)
        return 2
    if args.out and not written:
        print("mgbench-plot: no figure has data in these files", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
