"""mgbench's LLM runs beside TorchTune's on the same device (issue 47, items 1 and 5): one CSV row per timed
run and a table of the pairs.

    llm_peers.py RESULTS.h5 PEER.jsonl --csv llm_peers.csv [--peak-tflops X]

RESULTS.h5: mgbench's LLM runs whose names start with `mgbench-` (the rest are ignored; one that did not
complete is named and left out); PEER.jsonl: the lines
bench/peer_torchtune.py appended. Columns: side, recipe, padding, precision, compile, batch_size,
tokens_per_s, s_per_it, mfu (the issue's), then model, tokens_per_step, cupti, run_name. tokens_per_s is
real tokens (not padding; DPO: chosen and rejected) over the timed steps on both sides; mfu the model
FLOPs by mgbench's formula over the device's peak: mgbench's own for its rows, and for TorchTune's the
peak mgbench used at the same precision (its runs' `mfu_peak_tflops`), or --peak-tflops. A pair is the
two sides' rows of one recipe, padding, precision and compile setting (mgbench has no compile: its rows
pair with both of TorchTune's); ratio = mgbench / TorchTune tokens/s (> 1: mgbench faster).
Exits 2 naming the file (and line) when a file is missing, not a results file or not the peer's, or holds no run."""
import argparse
import csv
import json
import math
import sys
from pathlib import Path

COLUMNS = ("side", "recipe", "padding", "precision", "compile", "batch_size", "tokens_per_s", "s_per_it", "mfu",
           "model", "tokens_per_step", "cupti", "run_name")


# What a peer line must hold (bench/peer_torchtune.py writes them).
PEER_KEYS = ("recipe", "padding", "precision", "compile", "batch_size", "tokens_per_s", "s_per_it", "flops_per_s",
             "model", "run_name")


def fail(message):
    print(f"llm_peers.py: {message}", file=sys.stderr)
    sys.exit(2)


def mgbench_rows(path):
    """One row per LLM run named mgbench-*, read by the analysis package (python/mgbench_analysis: its checks of the
    file, schema and run status); a run that did not complete is named and left out."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
    import mgbench_analysis as mga
    from mgbench_analysis.attributes import display, is_llm
    try:
        runs = mga.read_file(path)
    except mga.ResultsError as e:
        fail(str(e))
    rows, peaks = [], {}
    for run in runs:
        a = run.attributes
        name = display(a.get("run_name"))
        if not name.startswith("mgbench-") or not is_llm(run):
            continue
        if run.status != "completed":
            print(f"# {name}: {run.status} ({run.error}): left out")
            continue
        steps = run.steps[0]
        timed = max(len(steps) - int(a.get("warmup_steps_excluded", 0)), 1)
        peak = float(a.get("mfu_peak_tflops", math.nan))
        if math.isfinite(peak):
            peaks[display(a["precision"])] = peak
        s = run.summary
        rows.append({"side": "mgbench", "recipe": display(a["recipe"]), "padding": display(a["padding"]),
                     "precision": display(a["precision"]), "compile": "", "batch_size": int(a["batch_size"]),
                     "tokens_per_s": float(s["tokens_per_s"]), "s_per_it": float(s["s_per_it"]),
                     "mfu": float(s["mfu"]), "model": display(a.get("model")),
                     "tokens_per_step": float(steps["tokens"].iloc[-timed:].sum()) / timed,
                     "cupti": display(a.get("cupti")), "run_name": name})
    return rows, peaks


def peer_rows(path, peaks, peak_tflops):
    rows = []
    try:
        lines = open(path).read().splitlines()
    except OSError as e:
        fail(f"{path}: {e.strerror}")
    for n, line in enumerate(lines, 1):
        try:
            r = json.loads(line)
        except json.JSONDecodeError as e:
            fail(f"{path}:{n}: not a JSON line ({e.msg})")
        missing = [k for k in PEER_KEYS if k not in r]
        if missing:
            fail(f"{path}:{n}: no {', '.join(missing)}: not a line of bench/peer_torchtune.py")
        peak = peak_tflops or peaks.get(r["precision"], math.nan)
        rows.append({"side": "torchtune", "recipe": r["recipe"], "padding": r["padding"], "precision": r["precision"],
                     "compile": str(r["compile"]).lower(), "batch_size": r["batch_size"],
                     "tokens_per_s": r["tokens_per_s"], "s_per_it": r["s_per_it"],
                     "mfu": r["flops_per_s"] / (peak * 1e12), "model": r["model"],
                     "tokens_per_step": r["tokens_per_s"] * r["s_per_it"], "cupti": "",
                     "run_name": r["run_name"]})
        if r.get("graphs_compiled_in_timed_steps"):
            print(f"# {r['run_name']}: {r['graphs_compiled_in_timed_steps']} torch.compile graph(s) compiled inside "
                  "its timed steps: its compile time is in its tokens/s")
    return rows


def pairs(rows):
    """(mgbench row, TorchTune row) of the same recipe, padding and precision; mgbench's CUPTI-traced rows left
    out (their cost is a row of its own)."""
    ours = [r for r in rows if r["side"] == "mgbench" and r["cupti"] != "true"]
    for peer in (r for r in rows if r["side"] == "torchtune"):
        for mine in ours:
            if all(mine[k] == peer[k] for k in ("recipe", "padding", "precision")):
                yield mine, peer


def print_markdown(rows):
    """The rows as docs/benchmarks.md's tables have them, each side's tokens/s beside its pair's ratio."""
    ratios = {}
    for mine, peer in pairs(rows):
        ratios.setdefault(mine["run_name"], []).append(f"{mine['tokens_per_s'] / peer['tokens_per_s']:.2f}x "
                                                      f"(compile={peer['compile']})")
    print("| side | recipe | padding | precision | compile | batch | tokens/step | tokens/s | s/it | MFU % | "
          "mgbench / TorchTune |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['side']} | {r['recipe']} | {r['padding']} | {r['precision']} | {r['compile'] or '-'} | "
              f"{r['batch_size']} | {r['tokens_per_step']:,.0f} | {r['tokens_per_s']:,.0f} | {r['s_per_it']:.4f} | "
              f"{100 * r['mfu']:.1f} | {', '.join(ratios.get(r['run_name'], [])) or '-'} |")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results")
    p.add_argument("peer")
    p.add_argument("--csv", required=True)
    p.add_argument("--peak-tflops", type=float, default=0.0)
    p.add_argument("--markdown", action="store_true", help="also the rows as a Markdown table (docs/benchmarks.md)")
    a = p.parse_args(argv)
    ours, peaks = mgbench_rows(a.results)
    rows = ours + peer_rows(a.peer, peaks, a.peak_tflops)
    if not rows:
        fail(f"{a.results}, {a.peer}: no runs")
    with open(a.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    print(f"# {len(rows)} run(s) -> {a.csv}")
    print(f"{'side':<10} {'recipe':<6} {'padding':<7} {'precision':<9} {'compile':<7} {'batch':>5} "
          f"{'tokens/step':>11} {'tokens/s':>10} {'s/it':>8} {'MFU %':>6}  run")
    for r in rows:
        print(f"{r['side']:<10} {r['recipe']:<6} {r['padding']:<7} {r['precision']:<9} {r['compile'] or '-':<7} "
              f"{r['batch_size']:>5} {r['tokens_per_step']:>11.0f} {r['tokens_per_s']:>10.0f} {r['s_per_it']:>8.4f} "
              f"{100 * r['mfu']:>6.1f}  {r['run_name']}")
    if a.markdown:
        print_markdown(rows)
    print("# mgbench / TorchTune, tokens/s (> 1: mgbench faster); the real tokens per timed step of each side")
    for mine, peer in pairs(rows):
        same = abs(mine["tokens_per_step"] - peer["tokens_per_step"]) <= 1e-6 * peer["tokens_per_step"]
        # Padded rows in the same order are the same work token for token; packed steps hold about as many.
        warning = "" if same or mine["padding"] != "pad" else "  NOT THE SAME ROWS: compare with care"
        print(f"{mine['recipe']} {mine['padding']} {mine['precision']} vs TorchTune compile={peer['compile']}: "
              f"{mine['tokens_per_s'] / peer['tokens_per_s']:.2f}x ({mine['run_name']} / {peer['run_name']}; "
              f"tokens/step {mine['tokens_per_step']:.0f} / {peer['tokens_per_step']:.0f}){warning}")


if __name__ == "__main__":
    main()
