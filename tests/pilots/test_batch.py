"""The batch systems behind one protocol (no batch system needed): the registry, each
system's walltime forms, and the pilots' cluster naming and shaping its pilots by kind
through dask-jobqueue's public surface."""

from __future__ import annotations

import pytest

from snakemake_executor_context.errors import ClusterError
from snakemake_executor_context.pilots.batch.registry import BACKENDS, batch_state, batch_system
from snakemake_executor_context.pilots.batch.system import PilotJob, clock, mebibytes
from snakemake_executor_context.pilots.batch.walltime import WalltimeError, read_walltime
from snakemake_executor_context.pilots.request import PilotOptions


def test_each_backend_names_a_dask_jobqueue_cluster_with_a_job_class() -> None:
    import dask_jobqueue

    assert sorted(BACKENDS) == ["htcondor", "lsf", "pbs", "sge", "slurm"]
    for name, system in BACKENDS.items():
        assert system.name == name and batch_system(name) is system
        assert getattr(dask_jobqueue, system.jobqueue_class).job_cls is not None
    with pytest.raises(ClusterError, match=r"'torque' is not a batch system.*htcondor, lsf"):
        batch_system("torque")


@pytest.mark.parametrize(
    ("backend", "seconds"),
    [("slurm", 240), ("pbs", 240), ("lsf", 4 * 3600), ("sge", None), ("htcondor", None)],
)
def test_the_same_text_is_a_different_walltime_to_each_system(backend, seconds) -> None:
    if seconds is None:
        with pytest.raises(WalltimeError, match=f"not a walltime {BACKENDS[backend].title}"):
            read_walltime(backend, "04:00")
    else:
        assert read_walltime(backend, "04:00").seconds == seconds


def test_each_system_writes_the_walltime_it_read() -> None:
    job = PilotJob(
        queue=None,
        account=None,
        qos=None,
        walltime="26:00:05",
        walltime_seconds=93605,
        gpus=1,
        gpu_type=None,
        cores=1,
        memory="2GB",
        disk="1GB",
        extra_directives=(),
    )
    written = {name: system.write_walltime(job) for name, system in BACKENDS.items()}
    # LSF counts whole minutes, rounded up; HTCondor compares seconds of running.
    assert written == {
        "slurm": "26:00:05",
        "pbs": "26:00:05",
        "sge": "26:00:05",
        "lsf": "26:01",
        "htcondor": "93605",
    }
    assert clock(59) == "00:00:59" and mebibytes("1kB") == 1


def test_a_job_state_is_read_only_where_its_system_is_read() -> None:
    assert batch_state("pbs", "12") is None  # PBS's states are not read yet
    assert batch_state("slurm", "") is None  # no job id: nothing to ask
    assert batch_state("torque", "12") is None


def test_pilots_are_named_by_kind_with_one_count_and_shaped_by_their_kind() -> None:
    from snakemake_executor_context.pilots.jobqueue import start_pilot_cluster

    options = PilotOptions(backend="slurm", gpus=2, gpu_types=("a100", "h100"), walltime="60")
    cluster = start_pilot_cluster(
        options, {"port": 0, "dashboard_address": ":0", "host": "127.0.0.1"}
    )
    try:
        names = []
        for _ in range(3):
            spec = cluster.new_worker_spec()
            cluster.worker_spec.update(spec)  # as SpecCluster.scale does
            names += list(spec)
        # With no demand published, each new pilot is of the kind held least.
        assert names == ["pilot-a100-0", "pilot-h100-1", "pilot-a100-2"]
        assert cluster.pilot_kinds == {"pilot-a100-0": 0, "pilot-h100-1": 1, "pilot-a100-2": 0}
        first, second = (cluster.worker_spec[name]["options"] for name in names[:2])
        assert "--gres=gpu:a100:2" in first["job_extra_directives"]
        assert "--gres=gpu:h100:2" in second["job_extra_directives"]
        # What dask-jobqueue completed for the cluster, every kind shares.
        assert first["security"] is second["security"] is cluster.new_spec["options"]["security"]
        assert first["config_name"] == "slurm"
    finally:
        cluster.close()
