"""Pilot jobs for every batch system, as dask-jobqueue writes them from this project's
settings (HTCondor, PBS, SGE and LSF cannot run on these machines: their job scripts and
submit commands are what is checked), and the pool's sizing policy."""

from __future__ import annotations

import shlex
from dataclasses import replace

import pytest

from snakemake_executor_context.defaults import PILOT_VARIABLE
from snakemake_executor_context.errors import ClusterError
from snakemake_executor_context.fleet.poolsizing import (
    DemandWatch,
    PoolDemand,
    PoolShape,
    pilots_to_release,
    pilots_wanted,
)
from snakemake_executor_context.pilots.batch.registry import BACKENDS
from snakemake_executor_context.pilots.request import PilotOptions, jobqueue_arguments
from snakemake_executor_context.server.pilot import pilot_gpus, pilot_settings
from snakemake_executor_context.settings.shape import Shape

OPTIONS = dict(
    queue="gpuq",
    account="proj7",
    walltime="02:00:00",
    gpus=2,
    gpu_types=("a100",),
    cores=4,
    memory="32GB",
    prologue=("source /shared/venv/bin/activate",),
)

#: The GPU request in each batch system's own syntax.
GPU_SYNTAX = {
    "slurm": "#SBATCH --gres=gpu:a100:2",
    "htcondor": "request_gpus = 2",
    "pbs": ":ngpus=2",
    "sge": "#$ -l gpu=2",
    "lsf": '#BSUB -gpu "num=2:gmodel=a100"',
}
WALLTIME_SYNTAX = {
    "slurm": "#SBATCH -t 02:00:00",
    "htcondor": "time() - EnteredCurrentStatus > 7200",
    "pbs": "#PBS -l walltime=02:00:00",
    "sge": "#$ -l h_rt=02:00:00",
    "lsf": "#BSUB -W 02:00",
}
SUBMIT = {
    "slurm": "sbatch",
    "htcondor": "condor_submit",
    "pbs": "qsub",
    "sge": "qsub",
    "lsf": "bsub",
}


def _job_script(backend: str, security=None, **changes) -> tuple[str, str]:
    import dask_jobqueue

    if backend == "sge":  # more than one core on Grid Engine takes a parallel environment
        changes.setdefault("extra_directives", ("-pe smp 4",))
    options = PilotOptions(backend=backend, **{**OPTIONS, **changes})
    name, kwargs = jobqueue_arguments(options, security, python="/shared/venv/bin/python")
    cluster = getattr(dask_jobqueue, name)(
        scheduler_options={"port": 0, "dashboard_address": ":0", "host": "127.0.0.1"},
        **kwargs,
    )
    try:
        return cluster.job_script(), cluster._dummy_job.submit_command
    finally:
        cluster.close()


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_job_scripts_carry_gpus_walltime_lifetime_and_prologue(backend: str) -> None:
    script, submit = _job_script(backend)
    assert GPU_SYNTAX[backend] in script, script
    assert WALLTIME_SYNTAX[backend] in script, script
    assert submit.split()[0] == SUBMIT[backend]
    # The server retires before the walltime: 7200 s - 300 s margin - 60 s stagger.
    assert "--lifetime 6840s --lifetime-stagger 60s" in script
    assert "--preload snakemake_executor_context.server.pilot" in script
    # Its nanny ends what a dead server left (a subreaper, strays/nannysweep.py).
    assert "--preload-nanny snakemake_executor_context.strays.nannysweep" in script
    # Both of its processes guard their ports against floods (cluster/floodguard.py).
    assert "--preload-nanny snakemake_executor_context.cluster.floodguard" in script
    assert "--worker-class snakemake_executor_context.cluster.floodguard.GuardedWorker" in script
    assert "source /shared/venv/bin/activate" in script
    # -P: the job's working directory is not on sys.path.
    assert "/shared/venv/bin/python -P -m distributed.cli.dask_worker" in script
    # Dask's local directory is the private root's scratch space on the node (made and
    # checked there first, or the job ends), never $TMPDIR/dask-scratch-space.
    made = script.index(
        "snakemake_context_paths=`/shared/venv/bin/python -P -m "
        "snakemake_executor_context.paths --shell` || exit 1"
    )
    evaluated = script.index("$snakemake_context_paths")
    assert made < evaluated < script.index(PILOT_VARIABLE) < script.index("--local-directory")
    assert "$DASK_TEMPORARY_DIRECTORY" in script.split("--local-directory", 1)[1].split()[0]
    # Dask's memory thresholds are off in the pilot as in local servers.
    assert "DASK_DISTRIBUTED__WORKER__MEMORY__TERMINATE=False" in script
    assert PILOT_VARIABLE in script


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_job_scripts_carry_the_credentials(backend: str, tmp_path) -> None:
    from distributed.security import Security

    # Files on a shared filesystem, as pilots read them.
    temporary = Security.temporary()
    paths = {}
    for part, pem in (
        ("ca", temporary.tls_ca_file),
        ("cert", temporary.tls_worker_cert),
        ("key", temporary.tls_worker_key),
    ):
        paths[part] = tmp_path / f"{part}.pem"
        paths[part].write_text(pem)
    security = Security(
        tls_ca_file=str(paths["ca"]),
        tls_worker_cert=str(paths["cert"]),
        tls_worker_key=str(paths["key"]),
        tls_scheduler_cert=str(paths["cert"]),
        tls_scheduler_key=str(paths["key"]),
        tls_client_cert=str(paths["cert"]),
        tls_client_key=str(paths["key"]),
        require_encryption=True,
    )
    script, _ = _job_script(backend, security=security)
    assert f"--tls-ca-file {paths['ca']}" in script
    assert f"--tls-cert {paths['cert']}" in script
    assert f"--tls-key {paths['key']}" in script
    assert "tls://" in script


def test_slurm_qos_type_free_gpus_and_extra_directives() -> None:
    script, _ = _job_script(
        "slurm", qos="high", gpu_types=(), extra_directives=("--constraint=ib",)
    )
    assert "#SBATCH --qos=high" in script
    assert "#SBATCH --gres=gpu:2" in script
    assert "#SBATCH --constraint=ib" in script
    assert "#SBATCH -p gpuq" in script and "#SBATCH -A proj7" in script


def test_pilot_settings_travel_in_the_job_script() -> None:
    script, _ = _job_script("slurm")
    line = next(
        line for line in script.splitlines() if line.startswith(f"export {PILOT_VARIABLE}=")
    )
    value = shlex.split(line.split("=", 1)[1])[0]
    settings = pilot_settings({PILOT_VARIABLE: value})
    assert settings.gpus == 2 and settings.gpu_type == "a100"
    # It retires before the walltime: 7200 s - 300 s margin - 60 s stagger.
    assert settings.lifetime_seconds == 6840
    assert settings == PilotOptions(backend="slurm", **OPTIONS).server_settings()


def test_bad_pilot_options_are_one_clear_error() -> None:
    with pytest.raises(
        ClusterError, match=r"--backend \(--context-pilots backend\) 'torque'.*choose one of"
    ):
        jobqueue_arguments(PilotOptions(backend="torque"))
    with pytest.raises(ClusterError, match=r"walltime '2h': it is not a walltime SLURM reads"):
        jobqueue_arguments(PilotOptions(backend="slurm", walltime="2h"))


def test_a_pilot_without_nvml_advertises_its_gpu_type(monkeypatch) -> None:
    # NVML cannot see the fake GRES GPUs of a test node: the pilot's GPU type names them.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    typed = PilotOptions(backend="slurm", gpus=2, gpu_types=("fakeb",)).server_settings()
    gpus = pilot_gpus(typed, [])
    assert [(g.name, g.uuid) for g in gpus] == [("fakeb", "2"), ("fakeb", "3")]
    assert pilot_gpus(PilotOptions(backend="slurm").server_settings(), []) == []


def test_pool_follows_ready_work_within_bounds() -> None:
    shape = PoolShape(minimum=1, maximum=6)
    assert pilots_wanted(PoolDemand(), shape) == 1
    assert pilots_wanted(PoolDemand(ready=3, remaining=3), shape) == 3
    assert pilots_wanted(PoolDemand(ready=40, remaining=400), shape) == 6
    assert pilots_wanted(PoolDemand(ready=8, remaining=8), PoolShape(0, 6, slots=4)) == 2


def test_pool_adds_a_pilot_only_for_a_load_worth_of_work() -> None:
    shape = PoolShape(minimum=0, maximum=10)
    # 10 jobs of 2 s left: 20 s of work, a load costs 10 s: two pilots, not ten.
    demand = PoolDemand(ready=10, remaining=10, job_seconds=2.0, load_seconds=10.0)
    assert pilots_wanted(demand, shape) == 2
    # Unknown times: the ready jobs decide.
    assert pilots_wanted(PoolDemand(ready=10, remaining=10), shape) == 10


def test_a_demand_whose_sequence_stops_growing_is_withdrawn() -> None:
    """A Snakemake killed before its shutdown leaves its last demand in the scheduler:
    the pool reads it as withdrawn once its number stops growing (else it would hold,
    and replace, pilots for it as long as the pool lives)."""
    watch = DemandWatch(stale_after=60.0)
    last = PoolDemand(ready=1, remaining=1, sequence=7)
    assert watch.current(last, now=100.0) == last
    assert watch.current(last, now=160.0) == last  # 60 s: not yet
    assert watch.current(last, now=160.5) is None
    newer = replace(last, sequence=8)
    assert watch.current(newer, now=161.0) == newer  # a living run's next check
    unnumbered = PoolDemand(ready=3, remaining=3)
    assert watch.current(unnumbered, now=1000.0) == unnumbered
    assert watch.current(None, now=1000.0) is None


def test_the_demand_crosses_the_scheduler_as_its_own_wire_form() -> None:
    """The executor publishes a PoolDemand's wire form in the scheduler's metadata and
    the pool reads it back with the same class: every field arrives, and a run's
    withdrawal (or no publication) reads as no demand."""
    import msgpack

    from snakemake_executor_context.fleet.poolsizing import WITHDRAWN

    sent = PoolDemand(
        ready=5,
        remaining=40,
        job_seconds=2.5,
        load_seconds=30.0,
        by_gpu_model={"H200": 3},
        sequence=12,
    )
    wire = msgpack.unpackb(msgpack.packb(sent.to_wire()))  # what Dask's RPC does to it
    assert PoolDemand.from_wire(wire) == sent
    assert PoolDemand.from_wire(msgpack.unpackb(msgpack.packb(dict(WITHDRAWN)))) is None
    assert PoolDemand.from_wire(None) is None
    assert "sequence" not in PoolDemand(ready=1).to_wire()
    with pytest.raises(ValueError):
        PoolDemand.from_wire({"ready": "many"})


def test_idle_pilots_are_released_longest_idle_first_keeping_the_minimum() -> None:
    idle = {"a": 100.0, "b": 50.0, "c": 190.0}
    assert pilots_to_release(idle, now=200.0, idle_timeout=60, count=3, minimum=0) == ["b", "a"]
    assert pilots_to_release(idle, now=200.0, idle_timeout=60, count=3, minimum=2) == ["b"]
    assert pilots_to_release(idle, now=200.0, idle_timeout=0, count=3, minimum=0) == []


def test_a_mixed_pool_adds_the_kind_the_ready_jobs_need() -> None:
    from snakemake_executor_context.fleet.poolsizing import next_kind

    assert next_kind([0, 0], [0, 0]) == 0
    assert next_kind([0, 0], [1, 0]) == 1  # no demand per type: balance the kinds
    assert next_kind([0, 5], [0, 0]) == 1
    assert next_kind([7, 2], [2, 0]) == 0  # 7/3 ready per pilot beats 2/1
    assert next_kind([4, 4], [3, 0]) == 1


def test_the_books_count_pilot_seconds_and_endings() -> None:
    from snakemake_executor_context.fleet.pilotbook import PilotRecord, account, ending_of

    assert ending_of("CANCELLED by 0") == "preempted"
    assert ending_of("PREEMPTED") == "preempted" and ending_of("NODE_FAIL") == "preempted"
    assert ending_of("OUT_OF_MEMORY") == "crashed" and ending_of(None) == "unknown"
    records = [
        PilotRecord("a", registered=10.0, ended=110.0, busy_seconds=60.0, batch_state="PREEMPTED"),
        PilotRecord("b", registered=20.0, busy_seconds=30.0),
        PilotRecord("c", ended=5.0, released=True, batch_state="CANCELLED"),
        PilotRecord("d"),
    ]
    books = account(records, now=120.0)
    assert books["submitted"] == 4 and books["started"] == 2 and books["running"] == 1
    assert books["preempted"] == 1 and books["retired"] == 1
    assert books["pilot_seconds"] == 200.0  # 100 + 100
    assert books["busy_seconds"] == 90.0 and books["idle_seconds"] == 110.0


def test_the_pools_books_cross_the_scheduler_as_their_own_wire_form() -> None:
    """The pool publishes its books' wire form; `status` reads them back with the same
    class (the account computed at the pool's time), and the catalog's event carries
    every field of a pilot's record."""
    import msgpack

    from snakemake_executor_context.fleet import events as ev
    from snakemake_executor_context.fleet.pilotbook import PilotRecord, PoolBooks

    records = (
        PilotRecord("a", pilot_kind="h200", registered=10.0, ended=110.0, busy_seconds=60.0),
        PilotRecord("b", pilot_kind="h200", job_id="77", registered=20.0),
    )
    books = PoolBooks(records, kinds=({"gpu_type": "h200"},), minimum=1, maximum=4, at=120.0)
    back = PoolBooks.from_wire(msgpack.unpackb(msgpack.packb(books.to_wire())))
    assert back == books
    assert back.account["pilot_seconds"] == 200.0 and back.account["running"] == 1
    assert back.describe().startswith("pool: 1 pilot(s) running (min 1, max 4)")
    assert PoolBooks.from_wire(None) is None and PoolBooks.from_wire({}) is None
    (event,) = ev.decode(ev.encode([ev.PilotBooked.of(records[1])]))
    assert isinstance(event, ev.PilotBooked)
    assert PilotRecord.from_wire(event.to_wire()) == records[1]


def test_the_pool_grows_one_pilot_beyond_those_proving_useful() -> None:
    from snakemake_executor_context.fleet.poolsizing import growth_limit

    shape = PoolShape(minimum=1, maximum=6)
    assert growth_limit(useful=1, pending=0, shape=shape) == 2
    assert growth_limit(useful=3, pending=2, shape=shape) == 6
    # Two pilots idled out while jobs were ready: the pool does not keep or replace them.
    assert growth_limit(useful=2, pending=0, shape=shape) == 3
    assert growth_limit(useful=0, pending=0, shape=PoolShape(minimum=2, maximum=6)) == 2


def test_which_pilots_prove_useful_is_decided_at_the_time_given() -> None:
    """The pool's usefulness check reads no clock: the time is an argument (a
    simulation drives it)."""
    from snakemake_executor_context.fleet.pilotbook import PilotRecord
    from snakemake_executor_context.fleet.poolsizing import useful_pilots

    records = [
        PilotRecord("busy", registered=0.0),
        PilotRecord("idle", registered=0.0),
        PilotRecord("new", registered=250.0),
        PilotRecord("queued"),
        PilotRecord("gone", registered=0.0, ended=50.0),
    ]
    idle = {"idle": 100.0, "new": 250.0}
    assert useful_pilots(records, idle, now=200.0, idle_timeout=120.0) == 3
    # At 300 s the idle one has idled out; the new one is recent still.
    assert useful_pilots(records, idle, now=300.0, idle_timeout=120.0) == 2
    assert useful_pilots(records, idle, now=400.0, idle_timeout=120.0) == 1


def test_a_node_local_model_cache_is_exported_before_the_prologue() -> None:
    script, _ = _job_script(
        "slurm",
        shape=Shape(model_cache="/local/$USER/models"),
        prologue=("rsync -a /shared/m/ x/",),
    )
    lines = script.splitlines()
    export = lines.index('export SNAKEMAKE_CONTEXT_MODEL_CACHE="/local/$USER/models"')
    assert lines.index("rsync -a /shared/m/ x/") > export
    assert 'mkdir -p -m 700 "/local/$USER/models"' in lines


def _overlap(spans: list[tuple[float, float]]) -> int:
    """The most spans open at one moment."""
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


@pytest.mark.parametrize(("limit", "cached", "most"), [(1, False, 1), (2, False, 2), (1, True, 4)])
def test_pilots_take_turns_to_load_from_a_shared_source(limit, cached, most) -> None:
    import time

    from distributed import Client, LocalCluster

    from snakemake_executor_context.server.loadturns import LoadTurns

    turns = LoadTurns(limit)

    def load(_: int) -> tuple[float, float]:
        turn = turns.take("f" * 64, cached=cached)
        try:
            began = time.time()
            time.sleep(0.4)  # reading the weights
            return began, time.time()
        finally:
            turn.release()

    # A real scheduler and four workers (threads of this process): the semaphore
    # lives on the scheduler, as it does for pilots on different nodes.
    with (
        LocalCluster(
            n_workers=4, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        workers = list(client.scheduler_info()["workers"])
        futures = [client.submit(load, i, workers=[w], pure=False) for i, w in enumerate(workers)]
        spans = client.gather(futures)
    assert _overlap(spans) == most, spans


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_a_pilot_runs_its_slots_not_its_cores_as_dask_threads(backend: str) -> None:
    import re

    script, _ = _job_script(backend, shape=Shape(slots=4, threads_per_slot=2))
    counts = re.findall(r"--nthreads (\d+)", script)
    assert counts and counts[-1] == "4", script  # the last one counts (click)
    from distributed.cli.dask_worker import main

    # Dask's own command line keeps the last of two --nthreads.
    option = next(p for p in main.params if p.name == "nthreads")
    assert not option.multiple


@pytest.mark.usefixtures("batch_commands")
def test_every_executor_pilot_setting_reaches_the_pilots() -> None:
    """The keys of the run's --context-pilots become the pilots' options, each one: a
    key that silently kept up's default (a GPU type, a directive) is a pool that
    never serves a rule (found when the pilots' GPU types were dropped)."""
    from snakemake.cli import parse_args
    from snakemake_interface_executor_plugins.registry import ExecutorPluginRegistry

    from snakemake_executor_context.pilots.arguments import pilot_settings_args

    _, args = parse_args(
        [
            "--executor", "context", "--jobs", "1",
            "--context-pilots", "backend=slurm", "gpu_type=a100", "gpu_type=h100",
            "directive=--constraint=ib", "prologue=module load cuda", "queue=gpuq",
            "account=proj7", "gpus=2", "cores=3", "memory=12GB", "walltime=02:00:00",
            "max=5",
            "--context-slots", "3",
        ]
    )  # fmt: skip
    settings = ExecutorPluginRegistry().get_plugin("context").get_settings(args)
    serve = pilot_settings_args(settings)
    options = PilotOptions.from_json(serve[serve.index("--pilots") + 1])
    assert options.gpu_types == ("a100", "h100")
    assert options.extra_directives == ("--constraint=ib",)
    assert options.prologue == ("module load cuda",)
    assert (options.queue, options.account, options.gpus, options.cores) == ("gpuq", "proj7", 2, 3)
    assert (options.memory, options.walltime) == ("12GB", "02:00:00")
    assert serve[serve.index("--max-pilots") + 1] == "5"
    assert options.shape.slots == 3  # the servers' shape travels with the pilots


def test_a_pilot_that_registered_after_the_last_sample_is_booked_registered() -> None:
    """CI once saw a pilot that served (its server in the catalog) booked as never
    registered: it registered after the pool's last once-a-second sample, and `down`
    stopped the pool before the next. The scheduler's hook had noted the time; the
    pool's end books it. A stand-in cluster places the registration between the two
    deterministically (a real SLURM pool only loses the race sometimes)."""
    from types import SimpleNamespace

    from snakemake_executor_context.fleet import events as ev
    from snakemake_executor_context.fleet.pilotbook import PilotRecord
    from snakemake_executor_context.pilots.pool import DemandAdaptive

    logged: list[object] = []
    scheduler = SimpleNamespace(log_event=lambda topic, message: logged.append(message))
    pool = DemandAdaptive.__new__(DemandAdaptive)
    pool.cluster = SimpleNamespace(scheduler=scheduler, workers={})
    pool.book = {"pilot-a-1": PilotRecord(name="pilot-a-1", pilot_kind="a", submitted=10.0)}
    pool.registrations = {"pilot-a-1": 12.5}  # the hook, after the last sample
    pool._departed, pool._booked = {}, {}
    pool.state, pool.periodic_callback = "stopped", None
    pool.stop("the cluster closes")
    (booked,) = [e for message in logged for e in ev.decode(message)]
    assert isinstance(booked, ev.PilotBooked)
    assert booked.registered == 12.5 and booked.ended is not None
