"""ReFrame checks of mgbench (reframe-hpc 4): the image job (throughput per rank, time per epoch,
accuracy sanity), a LoRA fine-tuning step (tokens/s) and `mgbench comm` (all-reduce busbw), each
read from mgbench's own output, with references and tolerances per system:partition -- as centres
run their PyTorch and NCCL checks (eth-cscs/cscs-reframe-tests, the EESSI test suite).

    reframe -C reframe/config/local.py -c reframe/checks -r -t nightly        # a workstation
    reframe -C reframe/config/slurm.py -c reframe/checks -r -t nightly        # a SLURM partition

Inputs (environment): MGBENCH (the binary; default `mgbench` from PATH, e.g. the loaded module),
MGBENCH_SHARED_DATA (a data tree: mnist/, llama3/, text/; docs/hpc.md), MGBENCH_LLM_MODEL (a Llama
checkpoint directory for the LoRA check; default `llama3.2-1b` with --init random), MGBENCH_REFERENCES
(a references file, below).

References are a site's own measurements, not this file's: MGBENCH_REFERENCES names a JSON file

    {"system:partition": {"MgbenchImage": {"img_per_s_per_rank": [value, lower, upper, "img/s"], ...}, ...}}

(ReFrame's reference tuples: bounds as fractions of the value, null for none), which
reframe/make_references.py writes from the run report of a good night (`reframe --report-file`).
A partition the file does not name, or no file, records its values without bounds.
"""
import csv
import json
import os

import reframe as rfm
import reframe.utility.sanity as sn
import reframe.utility.typecheck as typ
from reframe.core.builtins import performance_function, run_after, run_before, sanity_function, variable
from reframe.core.exceptions import SanityError

DATA = os.environ.get("MGBENCH_SHARED_DATA", "data")


def site_references(check, metrics, partition):
    """The `reference` of `check` (a class name) whose performance functions give `metrics` ({metric:
    unit}) on `partition` ("system:partition"): its tuples for `check` in MGBENCH_REFERENCES' file, else
    "*" recording without bounds. Raises ValueError naming the file, partition and check when that entry
    is not [value, lower, upper, unit] for each of the check's metrics here (a mistyped file must not
    pass as "no bounds"). Other partitions' entries are theirs to check: a partition with an energy
    counter has metrics one without has not."""
    reference = {"*": {metric: (0.0, None, None, unit) for metric, unit in metrics.items()}}
    path = os.environ.get("MGBENCH_REFERENCES")
    if not path:
        return reference
    with open(path) as f:
        sites = json.load(f)
    entry = sites.get(partition, {}).get(check)
    if entry is None:
        return reference
    if set(entry) != set(metrics) or not all(isinstance(t, list) and len(t) == 4 for t in entry.values()):
        raise ValueError(f"{path}: {partition}: {check}: expected [value, lower, upper, unit] for each of "
                         f"{sorted(metrics)}, got {entry!r}")
    reference[partition] = {metric: tuple(t) for metric, t in entry.items()}
    return reference


# The status field of `mgbench report --csv` (file,run_id,status,...) of a run that did not complete.
STATUS_NOT_COMPLETED = r"^[^,]*,[^,]*,(failed|aborted|preempted|running),"


def energy_row(path):
    """The run's row of `mgbench report --energy --csv` (the block whose header starts
    "file,run_id,ranks,source") as {column: text}. Raises SanityError naming the file when it has no such block."""
    with open(path) as f:
        rows = list(csv.reader(f))
    for i, row in enumerate(rows[:-1]):
        if row[:4] == ["file", "run_id", "ranks", "source"]:
            return dict(zip(row, rows[i + 1]))
    raise SanityError(f"{path}: no energy table (mgbench report --energy --csv)")


@sn.deferrable
def energy_value(path, column):
    """A number of the run's energy row (J/sample, J/token), when evaluated."""
    return float(energy_row(path)[column])


@sn.deferrable
def energy_sources(path):
    """The ranks' energy sources of the run's energy row (rapl, nvml, none), when evaluated."""
    return energy_row(path)["source"].split(",")


class MgbenchBase(rfm.RunOnlyRegressionTest):
    """What the checks share: the binary, 2 ranks on one node, any partition and environment; after the
    run, `mgbench report --csv` of its results file (report.csv), whose run status the sanity reads, and
    `mgbench report --energy --csv` (energy.csv). On a partition whose `features` name "energy" (its
    nodes have an energy counter mgbench reads: RAPL, or GPUs through NVML; reframe/config/local.py finds
    out, a site's config says so), a check with an energy_metric also reports it, and its sanity
    requires that every rank read a counter."""

    # (performance variable, energy.csv's column, unit); None: the check reports no energy.
    energy_metric = None

    mgbench = variable(str, value=os.environ.get("MGBENCH", "mgbench"))
    # Options appended to the check's own (`-S MgbenchImage.extra_opts=--lr,1e-9`: a run that must fail
    # the sanity; tests/python/test_reframe.py).
    extra_opts = variable(typ.List[str], value=[])
    valid_systems = ["*"]
    valid_prog_environs = ["*"]
    num_tasks = 2
    num_tasks_per_node = 2
    time_limit = "10m"
    tags = {"nightly"}

    @run_after("init")
    def set_executable(self):
        self.executable = self.mgbench
        self.env_vars = {"OMP_NUM_THREADS": "1"}

    @run_before("run")
    def add_extra_opts_and_report(self):
        self.executable_opts += self.extra_opts
        self.postrun_cmds = [f"{self.mgbench} report --csv results.h5 > report.csv",
                             f"{self.mgbench} report --energy --csv results.h5 > energy.csv"]

    def reports_energy(self):
        return self.energy_metric is not None and "energy" in self.current_partition.features

    def completed(self):
        """The results file's run completed (not failed, aborted, preempted or still running); where the
        check reports energy, every rank read a counter (none of the ranks' sources is "none")."""
        checks = [sn.assert_found(r"^[^,]*,[^,]*,completed,", "report.csv",
                                  msg="report.csv: no completed run in results.h5"),
                  sn.assert_not_found(STATUS_NOT_COMPLETED, "report.csv", msg="report.csv: the run did not complete")]
        if self.reports_energy():
            checks.append(sn.assert_not_in("none", energy_sources("energy.csv"),
                                           msg="energy.csv: a rank read no energy counter (source none) on a "
                                               "partition whose features say it has one"))
            checks.append(sn.assert_gt(energy_value("energy.csv", self.energy_metric[1]), 0,
                                       msg=f"energy.csv: {self.energy_metric[1]} is {{0}}, not a positive number"))
        return sn.all(checks)

    # Set up, when the partition is known: its features say whether the check reports energy.
    @run_after("setup")
    def add_energy_metric(self):
        if self.reports_energy():
            name, column, unit = self.energy_metric
            self.perf_variables[name] = sn.make_performance_function(energy_value("energy.csv", column), unit)

    @run_after("setup")
    def set_references(self):
        units = {name: expr.unit for name, expr in self.perf_variables.items()}
        self.reference = site_references(type(self).__name__, units, self.current_partition.fullname)


@rfm.simple_test
class MgbenchImage(MgbenchBase):
    """MobileNetV2 (width 0.25) on MNIST at 32 px, 2 epochs of 1024 images, batch 16: img/s per rank and
    s per epoch; sanity: the run completed, learned (its loss fell) and classifies well above chance."""

    descr = "mgbench image: throughput per rank, time per epoch, accuracy sanity"
    energy_metric = ("j_per_sample", "j_per_sample", "J/sample")
    # The test accuracy after the check's 2 epochs must reach this: 2.5x chance (10 classes). Measured
    # 44.5 % on the project's 2-core CPU machine (seed 42); a build that does not learn (--lr 1e-9)
    # stays at chance, 13-16 %.
    accuracy_floor_pct = 25.0
    # The last epoch's mean loss below this fraction of the first's (measured 3.85 -> 2.18: 0.57).
    loss_fall = 0.9

    @run_after("init")
    def set_options(self):
        self.executable_opts = ["image", "--data", f"{DATA}/mnist", "--image-size", "32", "--width-mult", "0.25",
                                "--threads", "1", "--limit-train", "1024", "--limit-test", "256", "--epochs", "2",
                                "--batch-size", "16", "--progress-interval", "1000", "--results", "results.h5"]

    @sanity_function
    def trained_and_evaluated(self):
        accuracy = sn.extractsingle(r"done: \d+ epoch\(s\) .*\| test accuracy ([\d.]+) %", self.stderr, 1, float)
        losses = sn.extractall(r"epoch \d+/2: loss ([\d.]+) ", self.stderr, 1, float)
        return sn.all([sn.assert_found(r"done: 2 epoch\(s\)", self.stderr), self.completed(),
                       sn.assert_ge(accuracy, self.accuracy_floor_pct,
                                    msg="test accuracy {0} % below the floor {1} %: the run did not learn"),
                       sn.assert_eq(sn.count(losses), 2),
                       sn.assert_lt(losses[-1], losses[0] * self.loss_fall,
                                    msg=f"the loss did not fall: {{0}} after {{1}} in the first epoch (x{self.loss_fall})")])

    @performance_function("img/s")
    def img_per_s_per_rank(self):
        total = sn.extractsingle(r"\| ([\d.]+) img/s \(all ranks\)", self.stderr, 1, float)
        return total / self.num_tasks

    @performance_function("s")
    def s_per_epoch(self):
        return sn.avg(sn.extractall(r"epoch \d+/\d+: .*\| train ([\d.]+) s", self.stderr, 1, float))


@rfm.simple_test
class MgbenchLora(MgbenchBase):
    """LoRA fine-tuning steps (alpaca): tokens/s of all ranks."""

    descr = "mgbench llm --recipe lora: tokens/s"
    energy_metric = ("j_per_token", "j_per_token", "J/token")
    model = variable(str, value=os.environ.get("MGBENCH_LLM_MODEL", "llama3.2-1b"))

    @run_after("init")
    def set_options(self):
        # A checkpoint folder with a tokenizer of its own trains with it (mgbench finds
        # original/tokenizer.model or tokenizer.model); the preset with random weights, or a folder
        # without one, takes the data tree's small one.
        checkpoint = os.path.isdir(self.model)
        own = checkpoint and any(os.path.isfile(os.path.join(self.model, name))
                                 for name in ("original/tokenizer.model", "tokenizer.model"))
        tokenizer = [] if own else ["--tokenizer", f"{DATA}/llama3/tiktoken_small.model"]
        init = [] if checkpoint else ["--init", "random"]
        self.executable_opts = ["llm", "--recipe", "lora", "--model", self.model, *init, *tokenizer, "--dataset",
                                "alpaca", "--data",
                                f"{DATA}/text/alpaca/alpaca_cleaned_first5k.json", "--limit", "64", "--batch-size", "2",
                                "--max-steps", "6", "--lora-rank", "4", "--precision", "fp32", "--threads", "1",
                                "--progress-interval", "1000", "--results", "results.h5"]

    @sanity_function
    def finite_loss(self):
        # A finite loss and a completed run (6 steps of a tiny random model: a falling loss is not promised).
        loss = sn.extractsingle(r"done: .*\| loss ([\d.]+)", self.stderr, 1, float)
        return sn.all([sn.assert_bounded(loss, 0, 100), self.completed()])

    @performance_function("tokens/s")
    def tokens_per_s(self):
        return sn.extractsingle(r"\| ([\d.]+) tokens/s \(all ranks\)", self.stderr, 1, float)


@rfm.simple_test
class MgbenchComm(MgbenchBase):
    """The all-reduce sweep, 1 KiB .. 4 MiB: nccl-tests' "Avg bus bandwidth", every result checked."""

    descr = "mgbench comm: all-reduce busbw"

    @run_after("init")
    def set_options(self):
        self.executable_opts = ["comm", "--collective", "all-reduce", "--min-bytes", "1024", "--max-bytes", "4M",
                                "--results", "results.h5"]

    @sanity_function
    def results_checked(self):
        return sn.all([sn.assert_found(r"# Out of bounds values : 0 OK", self.stdout), self.completed()])

    @performance_function("GB/s")
    def busbw(self):
        return sn.extractsingle(r"# Avg bus bandwidth\s*: ([\d.]+) GB/s", self.stdout, 1, float)
