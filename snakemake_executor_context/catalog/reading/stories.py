"""The story of a job, read from the catalog (``snakemake-context story``, and the
monitor's server page): what happened to it, in order, one line each.

A job is named by its Snakemake job id, by an attempt key, or by its rule with
wildcards (``score``, ``score(shard=3)``, ``score shard=3``), in the latest run unless
a run is named; or by the path of one of its output files (relative to the directory
the command runs in, or absolute), the newest job of the catalog's (or the named run's)
that declared it. Its lines come from its attempts (placed where and why, started,
ended, each attempt's log), the decisions the executor recorded about it (losses
and the budget each was charged to, requeues, cancellations: ``job_story``), and
its report.
"""

from __future__ import annotations

import datetime
import json
import os
import re
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from ...fleet.keys import is_attempt_key, job_key_of
from ...terminal import shown
from ..models import Attempt, Job, JobOutput, Run, Server
from ..models import JobStory as JobStoryRow
from ..store import CatalogError

__all__ = ["JobNotFound", "StoryLine", "find_job", "job_story", "story_text"]


class JobNotFound(CatalogError):
    """No job of the run matches what was asked for."""


@dataclass(frozen=True)
class StoryLine:
    """One thing that happened to a job."""

    at: float
    what: str
    detail: str = ""
    #: The attempt it is about ("a2"), if one.
    attempt: str = ""
    stimulus: str = ""

    def text(self) -> str:
        """'12:00:01.250  lost      a1  cpu0 left (...)  [stimulus fleet-server-left-9]'
        (what the catalog holds shown with its control characters escaped)."""
        clock = datetime.datetime.fromtimestamp(self.at).strftime("%H:%M:%S.%f")[:-3]
        stimulus = f"  [stimulus {shown(self.stimulus)}]" if self.stimulus else ""
        what, attempt, detail = shown(self.what), shown(self.attempt), shown(self.detail)
        return f"{clock}  {what:<9} {attempt:<3} {detail}{stimulus}".rstrip()


_RULE = re.compile(r"^(?P<rule>[\w.-]+)\s*(?:\((?P<w1>.*)\)|\s+(?P<w2>.+))?$")


def _run(session: Session, run_id: str | None) -> Run:
    query = select(Run).order_by(Run.started.desc()).limit(1)
    if run_id:
        query = select(Run).where(Run.run_id == run_id)
    run = session.scalars(query).first()
    if run is None:
        where = f"run {run_id}" if run_id else "run"
        raise JobNotFound(f"The catalog has no {where}. Fix: name a run of `status`'s list.")
    return run


def find_job(
    session: Session, name: str, run_id: str | None = None, *, cwd: str | None = None
) -> tuple[Run, Job]:
    """The run and the job ``name`` names (see the module); one line when none or
    several match. An attempt key names one job of one run (its keys are unique).
    With ``cwd`` (the directory a relative path is read from), ``name`` may be an
    output file's path."""
    if run_id is None:
        job = session.scalars(
            select(Job).join(Attempt, Attempt.job_id == Job.id).where(Attempt.key == name)
        ).first()
        if job is not None:
            return session.get_one(Run, job.run_pk), job
    absolute = os.path.normpath(os.path.join(cwd, name)) if cwd is not None else None
    if absolute is not None and (wrote := _by_output(session, absolute, run_id)) is not None:
        return wrote
    run = _run(session, run_id)
    jobs = select(Job).where(Job.run_pk == run.id)
    by_id = list(session.scalars(jobs.where(Job.jobid == name)))
    if by_id:
        found = by_id
    elif is_attempt_key(name) or is_attempt_key(f"{name}.1"):
        job_key = job_key_of(name) if is_attempt_key(name) else name
        keys = select(Attempt.job_id).where(Attempt.key.like(f"{job_key}.%"))
        found = list(session.scalars(jobs.where(Job.id.in_(keys))))
    else:
        found = _by_rule(session, jobs, name)
    if len(found) == 1:
        return run, found[0]
    if not found and absolute is not None and _path_like(name):
        where = f"run {run_id}" if run_id else "any run of the catalog"
        raise JobNotFound(
            f"No job of {where} has the output {absolute!r}. Fix: give the path of an "
            "output file of a recorded job (relative to this directory, or absolute), a "
            "job id, an attempt key, or a rule with its wildcards (score(shard=3))."
        )
    if not found:
        raise JobNotFound(
            f"No job '{name}' in run {run.run_id}. Fix: give a job id, an attempt key, "
            "a rule with its wildcards (score(shard=3)) or an output file's path; --run "
            "RUN for another run."
        )
    names = ", ".join(_title(job) for job in found[:6])
    more = " ..." if len(found) > 6 else ""
    raise JobNotFound(
        f"{len(found)} jobs of run {run.run_id} match '{name}': {names}{more}. Fix: add "
        "its wildcards, or give its job id."
    )


def _by_output(session: Session, absolute: str, run_id: str | None) -> tuple[Run, Job] | None:
    """The newest job (of run ``run_id``, if named) with the output file at path
    ``absolute``: recorded as Snakemake names it, absolute or relative to its run's
    workdir."""
    workdirs = session.scalars(select(Run.workdir).distinct())
    forms = {absolute} | {
        os.path.relpath(absolute, workdir)
        for workdir in workdirs
        if workdir and os.path.isabs(workdir) and _within(absolute, workdir)
    }
    query = (
        select(Run, Job, JobOutput.path)
        .join(Job, Job.run_pk == Run.id)
        .join(JobOutput, JobOutput.job_id == Job.id)
        .where(JobOutput.path.in_(sorted(forms)))
        .order_by(Run.started.desc(), Job.submitted.desc(), Job.id.desc())
    )
    if run_id:
        query = query.where(Run.run_id == run_id)
    for run, job, path in session.execute(query).tuples():
        if os.path.normpath(os.path.join(run.workdir or "", path)) == absolute:
            return run, job
    return None


def _within(path: str, directory: str) -> bool:
    return os.path.commonpath([path, directory]) == os.path.normpath(directory)


def _path_like(name: str) -> bool:
    """Whether ``name`` can only be a path: a rule's name is an identifier (no
    separator, no dot)."""
    match = _RULE.match(name.strip())
    return "/" in name or match is None or "." in match.group("rule")


def _by_rule(session: Session, jobs: object, name: str) -> list[Job]:
    match = _RULE.match(name.strip())
    if match is None:
        return []
    text = match.group("w1") or match.group("w2") or ""
    wanted = dict(part.strip().split("=", 1) for part in re.split(r"[,\s]+", text) if "=" in part)
    rows = session.scalars(jobs.where(Job.rule == match.group("rule")))  # type: ignore[attr-defined]
    return [job for job in rows if _wildcards(job).items() >= wanted.items()]


def _wildcards(job: Job) -> dict[str, str]:
    try:
        return {str(k): str(v) for k, v in json.loads(job.wildcards or "{}").items()}
    except ValueError:
        return {}


def _title(job: Job) -> str:
    """'score(shard=3) [job 12]', every value shown escaped (:func:`...terminal.shown`)."""
    wildcards = ", ".join(f"{shown(k)}={shown(v)}" for k, v in _wildcards(job).items())
    rule, jobid = shown(job.rule), shown(job.jobid)
    return f"{rule}({wildcards}) [job {jobid}]" if wildcards else f"{rule} [job {jobid}]"


def job_story(session: Session, job: Job) -> list[StoryLine]:
    """Everything recorded about ``job``, in order."""
    lines = [StoryLine(job.submitted, "ready", "handed to the executor")] if job.submitted else []
    names = dict(session.execute(select(Server.id, Server.name)).tuples().all())
    decisions = list(session.scalars(select(JobStoryRow).where(JobStoryRow.job_id == job.id)))
    told_lost = {row.attempt_key for row in decisions if row.what == "lost"}
    number: dict[str, str] = {}
    for attempt in session.scalars(
        select(Attempt).where(Attempt.job_id == job.id).order_by(Attempt.id)
    ):
        tag = number.setdefault(attempt.key, f"a{len(number) + 1}")
        where = names.get(attempt.server_id, "") if attempt.server_id else ""
        if attempt.dispatched is not None:
            log = f"; log {attempt.log}" if attempt.log else ""
            placed = f"on {where} ({attempt.placed_by})" if where else f"({attempt.placed_by})"
            lines.append(
                StoryLine(
                    attempt.dispatched, "placed", f"{placed}{log}", tag, attempt.stimulus or ""
                )
            )
        if attempt.started is not None:
            lines.append(StoryLine(attempt.started, "started", f"on {where}", tag))
        if attempt.finished is not None and attempt.outcome and attempt.key not in told_lost:
            items = f", {attempt.items} item(s)" if attempt.items else ""
            load = f", loaded its context in {attempt.load_seconds:.1f} s" if attempt.cold else ""
            lines.append(
                StoryLine(attempt.finished, "ended", f"{attempt.outcome}{items}{load}", tag)
            )
    for row in decisions:
        tag = number.get(row.attempt_key or "", "")
        lines.append(StoryLine(row.at, row.what, row.detail, tag, row.stimulus))
    if job.outcome and job.finished is not None:
        message = (job.message or "").strip().splitlines()
        detail = f"{job.outcome}: {message[0][:300]}" if message else job.outcome
        lines.append(StoryLine(job.finished, "reported", detail, stimulus=job.stimulus or ""))
    order = {"ready": 0, "placed": 1, "started": 2, "lost": 3, "ended": 3, "requeued": 4}
    return sorted(lines, key=lambda line: (line.at, order.get(line.what, 5)))


def story_text(run: Run, job: Job, lines: list[StoryLine]) -> str:
    """The story as ``snakemake-context story`` prints it."""
    head = f"{_title(job)} of run {shown(run.run_id)}: {shown(job.outcome or 'not reported')}"
    return "\n".join([head, *(f"  {line.text()}" for line in lines)])
