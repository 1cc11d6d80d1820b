"""The pilots' dask-jobqueue cluster, in the cluster process: one pool of batch jobs,
each new pilot of the kind the run's demand asks for.

Only dask-jobqueue's and Dask's public surface is used: the job class of the batch
system's cluster class (``job_cls``) passed to :class:`JobQueueCluster`, the worker
spec it builds (``new_spec``, whose ``options`` are the job's keyword arguments as
dask-jobqueue completed them), :meth:`SpecCluster.new_worker_spec`, the override
point that names each new worker and picks its spec, and the job's ``start`` (Dask's
``ProcessInterface``), where a failed submission is caught (:func:`submission_watched`).
"""

from __future__ import annotations

import re
import shlex
import sys
from typing import Any

import dask_jobqueue
from dask_jobqueue.core import Job, JobQueueCluster
from distributed.core import Status

from .pool import kind_wanted
from .request import PilotOptions, jobqueue_arguments

__all__ = ["PilotCluster", "start_pilot_cluster", "submission_failed", "submission_watched"]

#: The keyword arguments dask-jobqueue completes for the whole cluster (the workers'
#: credentials and network interface): every kind of pilot takes the cluster's.
_CLUSTER_WIDE = ("security", "interface")


class PilotCluster(JobQueueCluster):
    """A dask-jobqueue cluster whose pilots are named ``pilot-<label>-<n>`` (the GPU
    type, else the backend; one count over all kinds) and are each of the kind that
    :func:`~.pool.kind_wanted` picks; :attr:`pilot_kinds` says which kind each is."""

    def __init__(
        self, *, kinds: list[PilotOptions], kind_arguments: list[dict[str, Any]], **kwargs: Any
    ) -> None:
        #: The kinds of pilot (one per GPU type), and each pilot's kind by its name.
        self.kinds = kinds
        self.pilot_kinds: dict[str, int] = {}
        #: The number the next pilot's name tries first.
        self.next_pilot_number = 0
        kwargs["job_cls"] = submission_watched(kwargs["job_cls"])
        super().__init__(**kwargs)
        common = self.new_spec["options"]
        self.kind_specs = [
            {
                **self.new_spec,
                "options": {
                    **common,
                    **{k: v for k, v in arguments.items() if k not in _CLUSTER_WIDE},
                },
            }
            for arguments in kind_arguments
        ]

    def new_worker_spec(self) -> dict[str, Any]:
        """The next pilot: its name and spec, of the kind the demand asks for."""
        index = kind_wanted(self, self.kinds)
        label = self.kinds[index].gpu_type or self.kinds[index].backend
        number = self.next_pilot_number
        while f"pilot-{label}-{number}" in self.worker_spec:
            number += 1
        self.next_pilot_number = number + 1
        name = f"pilot-{label}-{number}"
        self.pilot_kinds[name] = index
        return {name: self.kind_specs[index]}


def start_pilot_cluster(
    options: PilotOptions,
    scheduler_options: dict[str, Any],
    security: Any = None,
) -> PilotCluster:
    """A dask-jobqueue cluster (with no pilots yet) whose scheduler runs here; with
    several GPU types, each new pilot is of the kind :func:`~.pool.kind_wanted` picks."""
    kinds = options.kinds()
    arguments = [jobqueue_arguments(kind, security, python=sys.executable) for kind in kinds]
    class_name, first = arguments[0]
    return PilotCluster(
        kinds=kinds,
        kind_arguments=[kind_kwargs for _, kind_kwargs in arguments],
        job_cls=getattr(dask_jobqueue, class_name).job_cls,
        scheduler_options=scheduler_options,
        **first,
    )


def submission_watched(job_cls: type[Job]) -> type[Job]:
    """``job_cls`` whose failed submission (its command exits non-zero, or cannot run)
    is kept as one line in the job's ``submit_failure`` (the pool drops the job and
    says so, :mod:`.pool`), instead of a traceback in the cluster's log and a pilot the
    pool waits for forever."""

    class Watched(job_cls):  # type: ignore[misc, valid-type]
        submit_failure = ""

        async def start(self) -> None:
            try:
                await super().start()
            except Exception as error:
                self.submit_failure = submission_failed(self.submit_command, error)
                # Started as far as Dask's cluster knows: the pool removes it at once.
                self.status = Status.running

    Watched.__name__ = Watched.__qualname__ = job_cls.__name__
    return Watched


def submission_failed(submit_command: str, error: BaseException) -> str:
    """One line on a failed submission: the command, and the first line of what it said
    on stderr (else stdout; dask-jobqueue's RuntimeError lists both), or why it could not
    run."""
    command = (shlex.split(submit_command) or ["the submit command"])[0]
    text = str(error)
    if not isinstance(error, RuntimeError) or "stderr:" not in text:
        return f"{command} could not run: {text.splitlines()[0] if text else repr(error)}"
    code = re.search(r"Exit code: (-?\d+)", text)
    head, _, stderr = text.partition("stderr:")
    said = [line.strip() for line in stderr.splitlines() if line.strip()]
    said = said or [
        line.strip() for line in head.partition("stdout:")[2].splitlines() if line.strip()
    ]
    exit_text = f" (exit {code.group(1)})" if code else ""
    return f"{command} failed{exit_text}: {said[0] if said else 'it said nothing'}"
