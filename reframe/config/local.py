"""ReFrame site configuration: this machine, ranks started with Open MPI's mpirun (no scheduler).
    reframe -C reframe/config/local.py -c reframe/checks -r -t nightly

The partition has the feature "energy" when this machine has a counter mgbench reads (the checks
then report J/sample and J/token, mgbench_checks.py): a readable RAPL package under
/sys/class/powercap (MGBENCH_POWERCAP_ROOT: another directory, as mgbench reads it), or an NVIDIA
GPU (NVML). A site's config names its partitions' features itself (reframe/config/slurm.py).
"""
import glob
import os


def has_energy_counter():
    root = os.environ.get("MGBENCH_POWERCAP_ROOT") or "/sys/class/powercap"
    rapl = any(os.access(p, os.R_OK) for p in glob.glob(os.path.join(root, "intel-rapl:*", "energy_uj")))
    return rapl or os.path.exists("/dev/nvidiactl")


site_configuration = {
    "systems": [{
        "name": "local",
        "descr": "a workstation: mpirun, no batch system",
        "hostnames": [".*"],
        "partitions": [{
            "name": "default",
            "scheduler": "local",
            "launcher": "mpirun",
            "environs": ["builtin"],
            "max_jobs": 1,
            "features": ["energy"] if has_energy_counter() else [],
        }],
    }],
    "environments": [{"name": "builtin"}],
}
