"""The workload identity: which runs are the same workload (what is computed, on what device and GPU
model). The attribute list is ``workload_identity.txt`` beside this module, the one file
`mgbench report` compiles in too (modules/report/workload.h); efficiencies and reference comparisons
pair only runs equal in every attribute of it.
"""
from __future__ import annotations

from importlib import resources
from typing import List, Tuple

from .attributes import display, recipe_of
from .results import Run


def _read_attributes() -> Tuple[str, ...]:
    text = resources.files(__package__).joinpath("workload_identity.txt").read_text(encoding="utf-8")
    return tuple(line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#"))


#: The identity's attribute names, in the list's order.
ATTRIBUTES: Tuple[str, ...] = _read_attributes()


def value(run: Run, attribute: str) -> str:
    """A run's value of an identity attribute as `mgbench report` shows it: "" where the run lacks it,
    and for ``recipe`` the job's only recipe of the time for runs written before recipes were recorded."""
    return recipe_of(run) if attribute == "recipe" else display(run.attributes.get(attribute))


def identity(run: Run, **overrides: str) -> str:
    """The run's identity, "name=value" of every attribute joined by ';' (the C++ report's text);
    ``overrides`` replaces the values of the attributes it names (``precision="fp64"``)."""
    return ";".join(f"{name}={overrides[name] if name in overrides else value(run, name)}" for name in ATTRIBUTES)


def differences(a: Run, b: Run) -> List[Tuple[str, str, str]]:
    """The identity attributes in which runs a and b differ, as (name, a's value, b's value), in the
    list's order; empty for runs of one workload."""
    out = []
    for name in ATTRIBUTES:
        va, vb = value(a, name), value(b, name)
        if va != vb:
            out.append((name, va, vb))
    return out


def describe(diffs: List[Tuple[str, str, str]], limit: int = 3) -> str:
    """"gpu_model 'NVIDIA H100' vs 'NVIDIA A100', ..." -- at most ``limit`` differences, then "..."."""
    text = ", ".join(f"{name} '{va}' vs '{vb}'" for name, va, vb in diffs[:limit])
    return text + (", ..." if len(diffs) > limit else "")


def hardware(run: Run) -> str:
    """Where a run ran: the GPU model where recorded, else the device kind, else "-"."""
    gpu = display(run.attributes.get("gpu_model"))
    device = display(run.attributes.get("device"))
    return gpu or device or "-"


def hardware_cell(run: Run) -> str:
    """hardware() as one whitespace-free table cell, as the report's: the model only (its memory and
    compute capability, after ", ", are the CSV's), "NVIDIA " dropped, spaces as '-'."""
    text = hardware(run).split(", ", 1)[0]
    return (text[len("NVIDIA "):] if text.startswith("NVIDIA ") else text).replace(" ", "-").replace("\t", "-")
