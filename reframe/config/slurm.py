"""ReFrame site configuration: a SLURM partition, one rank per task with srun (PMIx: SLURM_MPI_TYPE).
As given, the one-node cluster of tests/slurm/cluster.sh (cluster mgbench-test, partition test; no
accounting database, so jobs are polled with squeue); a centre names its own partitions, their
access options and environments (modules: "modules": ["mgbench"]) here, and the feature "energy" for
a partition whose nodes have an energy counter mgbench reads (NVIDIA GPUs; RAPL readable by users):
its checks then report J/sample and J/token and require every rank to read one.
    SLURM_CONF=... reframe -C reframe/config/slurm.py -c reframe/checks -r -t nightly
"""
site_configuration = {
    "systems": [{
        "name": "mgbench-test",
        "descr": "the test SLURM cluster (tests/slurm/cluster.sh)",
        "hostnames": [".*"],
        "partitions": [{
            "name": "test",
            "scheduler": "squeue",
            "launcher": "srun",
            "access": ["--partition=test", "--cpus-per-task=1"],
            "environs": ["builtin"],
            "max_jobs": 1,
        }],
    }],
    "environments": [{"name": "builtin", "env_vars": [["SLURM_MPI_TYPE", "pmix"]]}],
}
