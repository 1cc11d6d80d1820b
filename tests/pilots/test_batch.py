"""The batch systems behind one protocol (no batch system needed): the registry, each
system's walltime forms, and the pilots' cluster naming and shaping its pilots by kind
through dask-jobqueue's public surface."""

from __future__ import annotations

import pytest

from snakemake_executor_context.errors import ClusterError
from snakemake_executor_context.pilots.batch.registry import BACKENDS, batch_state, batch_system
from snakemake_executor_context.pilots.batch.sge import qacct_end_state, sge_directives
from snakemake_executor_context.pilots.batch.system import PilotJob, clock, mebibytes
from snakemake_executor_context.pilots.batch.walltime import WalltimeError, read_walltime
from snakemake_executor_context.pilots.request import PilotOptions, jobqueue_arguments


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


# What Grid Engine writes, and how it is read.

QACCT = """==============================================================
qname        gpu.q
jobname      snakemake-context
jobnumber    {number}
failed       {failed}
exit_status  {status}
"""


@pytest.mark.parametrize(
    ("failed", "status", "state"),
    [
        ("0    ", "0", "COMPLETED"),
        ("0    ", "3", "FAILED"),
        ("100 : assumedly after job", "137                  (Killed)", "CANCELLED"),
        ("37  : qmaster enforced h_rt, h_cpu, or h_vmem limit", "137", "TIMEOUT"),
        ("28  : changing into working directory", "0", "FAILED"),
    ],
)
def test_qacct_records_read_as_batch_states(failed: str, status: str, state: str) -> None:
    # An older job of the same number first (a recreated cell numbers jobs anew).
    older = QACCT.format(number=4, failed="0", status="0")
    assert qacct_end_state(older + QACCT.format(number=4, failed=failed, status=status)) == state
    assert qacct_end_state("") is None


def test_sge_pilot_directives() -> None:
    assert sge_directives(1, "2GB", ()) == ["-S /bin/bash", "-l mem_free=1907M"]
    assert sge_directives(1, "16GB", ("-S /bin/zsh",)) == ["-l mem_free=15258M"]
    assert clock(93605) == "26:00:05"  # h_rt: hours past 24 kept in the hours
    _, kwargs = jobqueue_arguments(PilotOptions(backend="sge", walltime="26:00:05"))
    assert kwargs["walltime"] == "26:00:05" and kwargs["resource_spec"] == "gpu=1"
    _, kwargs = jobqueue_arguments(PilotOptions(backend="sge", walltime="93605"))
    assert kwargs["walltime"] == "26:00:05"
    # SLURM's day form is not Grid Engine's: refused by name, never misread.
    with pytest.raises(ClusterError, match=r"'1-02:00:05'.*not a walltime SGE reads"):
        jobqueue_arguments(PilotOptions(backend="sge", walltime="1-02:00:05"))
    assert kwargs["job_extra_directives"] == ["-S /bin/bash", "-l mem_free=15258M"]
    with pytest.raises(ClusterError, match=r"--context-pilots cores=4 on Grid Engine.*-pe smp 4"):
        jobqueue_arguments(PilotOptions(backend="sge", cores=4))
    assert jobqueue_arguments(PilotOptions(backend="sge", cores=4, extra_directives=("-pe smp 4",)))
