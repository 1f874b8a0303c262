"""ReFrame site configuration: this machine, ranks started with Open MPI's mpirun (no scheduler).
    reframe -C reframe/config/local.py -c reframe/checks -r -t nightly
"""
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
        }],
    }],
    "environments": [{"name": "builtin"}],
}
