"""mgbench_analysis: mgbench results files (HDF5, docs/results-schema.md) as pandas frames, and figures.

    import mgbench_analysis as mga
    runs = mga.runs("outputs/*/results.h5")   # one row per run, as `mgbench report` (plus every attribute)
    steps = mga.steps("outputs/")             # one row per rank and optimizer step
    mga.report_table(runs, "image")           # the `mgbench report --csv` table, unrounded
    check = mga.compare("reference.h5", "tonight/")   # `mgbench report --reference`; mga.passed(check)

Command line: ``mgbench-plot FILES... --out DIR [--html DIR] [--paper]``.
"""
from .reference import compare, exit_status, passed, repeats
from .report import CSV_COLUMNS, report_table, runs
from .stragglers import STRAGGLER_MARGIN, stragglers
from .results import (PHASES, SCHEMA_NAME, SUPPORTED_SCHEMA_VERSIONS, ResultsError, Run, comm, cuda, energy, epochs, expand,
                      read, read_file, steps)

__all__ = ["compare", "exit_status", "passed", "repeats", "runs", "steps", "epochs", "cuda", "energy", "comm", "stragglers", "STRAGGLER_MARGIN", "report_table", "read", "read_file", "expand", "Run", "ResultsError",
           "PHASES", "SCHEMA_NAME", "SUPPORTED_SCHEMA_VERSIONS", "CSV_COLUMNS"]
__version__ = "0.11.0"  # pyproject.toml reads it; schema 15
