"""Run attributes as `mgbench report` reads them: the text it shows and compares workloads by, and the
facts every table derives from them (an LLM run, its recipe). Shared by ``report``, ``workload`` and
``reference``, and importing none of them.
"""
from __future__ import annotations

import math

from .results import Run


def display(value) -> str:
    """An attribute as `mgbench report` shows it (and compares workloads by): text as is, integers in
    decimal, numbers as printf's %g; "" when absent."""
    if value is None:
        return ""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:g}"
    return str(value)


def is_llm(run: Run) -> bool:
    """Whether the run is an LLM fine-tuning run (task ``llm`` or ``llm-eval``)."""
    return str(run.attributes.get("task", "")).startswith("llm")


def warmup_steps_excluded(run: Run) -> int:
    """--warmup-steps-excluded of a run (0 where not recorded): its rates leave those steps out, so two
    runs' rates compare only where it is the same."""
    return int(run.attributes.get("warmup_steps_excluded", 0) or 0)


def recipe_of(run: Run) -> str:
    """The run's recipe; runs written before recipes were recorded ran the only recipe of their job then."""
    recipe = display(run.attributes.get("recipe"))
    return recipe if recipe else ("lora" if is_llm(run) else "classification")
