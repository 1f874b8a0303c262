#!/usr/bin/env python3
"""References for reframe/checks/mgbench_checks.py from the run reports of good nights.

    reframe -C reframe/config/slurm.py -c reframe/checks -r -t nightly --report-file night1.json
    python reframe/make_references.py night1.json [night2.json ...] --tolerance 0.2 -o references.json
    MGBENCH_REFERENCES=references.json reframe -C reframe/config/slurm.py -c reframe/checks -r -t nightly

Each value is the median over the reports of a check's metric on one system:partition (only checks
that passed count). A tolerance t is the slowdown allowed, by the rule of `mgbench report --reference`:
a time (s), a size (MiB) or an energy per unit of work (J/sample, J/token) may grow to (1 + t) x its value, a rate (a unit per second: img/s,
tokens/s, GB/s) fall to 1 / (1 + t) of it -- ReFrame's bounds (None, t) and (-t / (1 + t), None). The
output is the JSON
MGBENCH_REFERENCES reads: {"system:partition": {"Check": {"metric": [value, lower, upper, unit]}}}.
Bad input (an unreadable report, a unit with no known direction, a tolerance not above 0) exits 2
with a message naming it.
"""
import argparse
import json
import statistics
import sys
from collections import defaultdict

LOWER_IS_BETTER = {"s", "MiB", "J/sample", "J/token"}  # smaller is better (time, size, energy a unit of work);
# rates (".../s") are higher-better


def bounds(unit, tolerance):
    """ReFrame's (lower, upper) fractions for a metric in `unit`. Raises ValueError for a unit that is
    neither a rate nor one of LOWER_IS_BETTER."""
    if unit.endswith("/s"):
        return -tolerance / (1.0 + tolerance), None
    if unit in LOWER_IS_BETTER:
        return None, tolerance
    raise ValueError(f"unit {unit!r}: neither a rate (.../s) nor one of {sorted(LOWER_IS_BETTER)}")


def passed_values(path):
    """[(system:partition, check, metric, unit, value)] of the passed test cases of the report at
    `path`. Raises ValueError naming the file where it is not a ReFrame run report (unreadable, or
    a run, test case or performance value without the fields ReFrame 4 writes)."""
    try:
        with open(path) as f:
            report = json.load(f)
        cases = {}
        for run in report["runs"]:  # retries: a later run's case replaces an earlier one's
            for case in run["testcases"]:
                cases[(case["name"], case["system"], case["partition"])] = case
        out = []
        for (name, system, partition), case in cases.items():
            if case["result"] != "pass":  # ReFrame 4's results: pass, fail, ...
                print(f"{path}: {name} on {system}:{partition} {case['result']}: left out", file=sys.stderr)
                continue
            for key, (value, _ref, _lower, _upper, unit, *_result) in case["perfvalues"].items():
                if value is not None:
                    out.append((f"{system}:{partition}", name.split()[0], key.split(":")[-1], unit, float(value)))
        return out
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{path}: not a ReFrame run report ({type(e).__name__}: {e})") from None


def values(report_paths):
    """{(system:partition, check, metric, unit): [value per report]} of the passed test cases."""
    out = defaultdict(list)
    for path in report_paths:
        for *key, value in passed_values(path):
            out[tuple(key)].append(value)
    return out


def references(report_paths, tolerance):
    """The MGBENCH_REFERENCES document of the reports' passed cases at `tolerance`."""
    doc = defaultdict(lambda: defaultdict(dict))
    for (partition, check, metric, unit), vals in sorted(values(report_paths).items()):
        lower, upper = bounds(unit, tolerance)
        doc[partition][check][metric] = [statistics.median(vals), lower, upper, unit]
    return doc


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", help="ReFrame run reports (reframe --report-file)")
    parser.add_argument("--tolerance", type=float, required=True,
                        help="the slowdown allowed, a fraction above 0: 0.2 lets a time grow to 1.2x, a rate "
                             "fall to 1/1.2")
    parser.add_argument("-o", "--output", help="the references file to write (default: stdout)")
    args = parser.parse_args(argv)
    if not args.tolerance > 0.0:
        print(f"make_references: --tolerance {args.tolerance}: expected a fraction above 0", file=sys.stderr)
        return 2
    try:
        doc = references(args.reports, args.tolerance)
    except ValueError as e:
        print(f"make_references: {e}", file=sys.stderr)
        return 2
    if not doc:
        print(f"make_references: no passed check with performance values in {args.reports}", file=sys.stderr)
        return 2
    text = json.dumps(doc, indent=2) + "\n"
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
