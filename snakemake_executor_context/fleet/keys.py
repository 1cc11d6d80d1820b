"""Run ids and the Dask keys of job attempts: one format each, defined here only.

A run's id is its start time and the Snakemake process's pid,
``20261201T070021-28579`` (:func:`new_run_id`). It names files of the run
(``.snakemake/context/reports/<run id>.html``, its summary, its client log): an id
read from a catalog, which another user may have written, becomes part of a path
only once :func:`is_run_id` says it has this form (an id such as ``/abs/x`` or
``../../x`` never does).

A Snakemake job gets a *job key* when the executor receives it, and every dispatch
of it to a server (an *attempt*) gets an attempt key, the job key plus the
attempt's number::

    score-17-a1-3f9c2b1e.1     rule 'score', job 17, Snakemake attempt 1, dispatch 1
    score-17-a1-3f9c2b1e.2     the same job dispatched again (its server was lost)

The random part keeps the keys of runs that share a persistent cluster apart.
"""

from __future__ import annotations

import os
import re
import time

__all__ = [
    "RUN_ID_FORM",
    "attempt_key",
    "attempt_log",
    "attempt_number",
    "is_attempt_key",
    "is_run_id",
    "job_key",
    "job_key_of",
    "new_run_id",
    "rule_of",
    "safe_name",
]

_ATTEMPT = re.compile(r"^.+-[^-]+-a\d+-[0-9a-f]+\.\d+$")
_RUN_ID = re.compile(r"^[0-9]{8}T[0-9]{6}-[0-9]{1,10}$")
#: A run id's form, for messages.
RUN_ID_FORM = "YYYYMMDDTHHMMSS-PID, such as 20261201T070021-28579"


def new_run_id(at: float | None = None, pid: int | None = None) -> str:
    """The id of a run that starts now (``at``: seconds since the epoch) in this
    process (``pid``), in local time: ``20261201T070021-28579``."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.localtime(at))
    return f"{stamp}-{os.getpid() if pid is None else pid}"


def is_run_id(text: object) -> bool:
    """Whether ``text`` has the form of :func:`new_run_id` (and so is safe in a file
    name: digits, one ``T`` and one ``-``)."""
    return isinstance(text, str) and _RUN_ID.match(text) is not None


def safe_name(text: object) -> str:
    """A rule, group or server name reduced to the characters keys and file names
    allow, never empty and never starting with a dot (``.`` and ``..`` name
    directories, not files)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(text))
    return "_" + safe[1:] if safe.startswith(".") else safe or "_"


def job_key(name: object, jobid: object, attempt: int, nonce: str) -> str:
    """The key of one Snakemake job: rule (or group) name, job id, Snakemake's
    attempt number and a random hex ``nonce``."""
    return f"{safe_name(name)}-{jobid}-a{attempt}-{nonce}"


def attempt_key(job: str, number: int) -> str:
    """The key of the ``number``-th dispatch (1, 2, ...) of the job keyed ``job``."""
    return f"{job}.{number}"


def job_key_of(key: str) -> str:
    """The job key an attempt key belongs to."""
    return key.rpartition(".")[0] if is_attempt_key(key) else key


def is_attempt_key(key: object) -> bool:
    """Whether a Dask key is an attempt of this plugin (and not some other task)."""
    return isinstance(key, str) and _ATTEMPT.match(key) is not None


def attempt_number(key: str) -> int:
    """The dispatch number of an attempt key (1 for a job key)."""
    number = key.rpartition(".")[2]
    return int(number) if is_attempt_key(key) and number.isdigit() else 1


def attempt_log(path: str, number: int) -> str:
    """The log of the ``number``-th attempt of a job whose first attempt logs to
    ``path``: ``x.log``, then ``x.2.log``, ``x.3.log`` (a retry never overwrites the
    previous attempt's log)."""
    if number <= 1 or not path:
        return path
    stem, dot, ext = path.rpartition(".")
    return f"{stem}.{number}.{ext}" if dot else f"{path}.{number}"


def rule_of(key: str) -> str:
    """The (safe) rule or group name an attempt key starts with ('' if none)."""
    if not is_attempt_key(key):
        return ""
    return job_key_of(key).rsplit("-", 3)[0]
