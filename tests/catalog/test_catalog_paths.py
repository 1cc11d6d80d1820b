"""Paths made from what a catalog or a scheduler says, and the files the command line
writes: a run id read from a catalog becomes part of a file name only in its own form;
a report, an export or a run's summary is written whole, never through another user's
symlink, over their file, or above a directory that does not exist.

The catalogs are built with the catalog's own recording code (tests/catalog_builder.py)
and read by the real ``snakemake-context report``. The planted symlinks and files
belong to the real second user (``ctxattacker``): those tests need root, like
tests/paths/test_planted_paths.py.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from pathlib import Path

import pytest

from snakemake_executor_context import paths
from snakemake_executor_context.cluster.infofiles import ClusterFiles
from snakemake_executor_context.cluster.nannies import held_until
from snakemake_executor_context.errors import ContextExecutorError, UnsafePathError
from snakemake_executor_context.fleet.keys import is_run_id, new_run_id
from tests.catalog_builder import CatalogBuilder
from tests.conftest import BIN, need_second_user

#: A run id of this plugin's form.
RUN = "20261201T070021-4242"


def _catalog(path: Path, run_id: str) -> Path:
    with CatalogBuilder(path) as b:
        run = b.run(run_id, jobs_total=1)
        server = b.server("gpu0")
        model = b.context("smollm2")
        b.load(server, model)
        b.job(run, "score", server=server, context=model)
        b.finish_run(run)
    return path


def _tree(root: Path) -> dict[str, tuple[object, ...]]:
    """Every entry under ``root`` (never followed): kind, owner, mode and content; the
    catalog and SQLite's files beside it left out (a reader may make them)."""
    found: dict[str, tuple[object, ...]] = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(top) / name
            if name.startswith("c.db"):
                continue
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                what: object = os.readlink(path)
            elif stat.S_ISREG(info.st_mode):
                what = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                what = "dir"
            found[str(path.relative_to(root))] = (info.st_mode, info.st_uid, what)
    return found


def _report(workdir: Path, catalog: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "snakemake-context"), "report", "--catalog", str(catalog), *args],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _refused(run: subprocess.CompletedProcess[str], says: str) -> str:
    assert run.returncode == 1, run.stdout + run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], run.stderr
    return lines[0]


def test_run_ids_have_one_form():
    made = new_run_id(at=1_764_572_421.0, pid=28579)
    assert is_run_id(made) and made.endswith("-28579")
    for bad in ("/abs/x", "../../x", "..", "", "20261201T070021-1/../x", "run-1", None):
        assert not is_run_id(bad), bad


@pytest.mark.parametrize("run_id", ["/abs/x", "../../x", "{tmp}/abs/x"])
def test_a_run_id_that_is_a_path_names_no_file(tmp_path, run_id):
    run_id = run_id.format(tmp=tmp_path)
    workdir = tmp_path / "wf" / "deep"
    workdir.mkdir(parents=True)
    catalog = _catalog(tmp_path / "c.db", run_id)
    before, abs_before = _tree(tmp_path), os.path.lexists("/abs")
    refused = _refused(_report(workdir, catalog), "is not of the form")
    assert "-o FILE" in refused
    assert _tree(tmp_path) == before  # no reports directory, nothing above it
    assert os.path.lexists("/abs") == abs_before


def test_a_run_id_of_its_form_gets_its_report_in_the_reports_directory(tmp_path):
    workdir = tmp_path / "wf"
    workdir.mkdir()
    catalog = _catalog(tmp_path / "c.db", RUN)
    before = _tree(tmp_path)
    out = _report(workdir, catalog)
    assert out.returncode == 0, out.stderr
    report = workdir / ".snakemake" / "context" / "reports" / f"{RUN}.html"
    assert str(report) in out.stdout
    new = set(_tree(tmp_path)) - set(before)
    assert new == {"wf/.snakemake", "wf/.snakemake/context", "wf/.snakemake/context/reports"} | {
        str(report.relative_to(tmp_path))
    }
    # A new file gets the umask's mode (a report is for reading), not 0600.
    assert stat.S_IMODE(report.stat().st_mode) == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# -- what another user planted where the report goes ----------------------------------


@pytest.fixture(scope="module")
def second_uid() -> int:
    return need_second_user()


@pytest.mark.parametrize(
    ("planted", "says"),
    [
        ("their symlink to their file", "is a symlink"),
        ("my symlink to their file", "belongs to uid"),
        ("their file", "belongs to uid"),
        ("their reports directory (a symlink)", "is a symlink"),
    ],
)
def test_what_another_user_planted_at_the_reports_name_is_refused(
    tmp_path, second_uid, planted, says
):
    workdir = tmp_path / "wf"
    reports = workdir / ".snakemake" / "context" / "reports"
    reports.mkdir(parents=True)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, second_uid, second_uid)
    victim = theirs / "victim.html"
    victim.write_text("theirs\n")
    os.chown(victim, second_uid, second_uid)
    name = reports / f"{RUN}.html"
    if planted == "their file":
        name.write_text("theirs\n")
        os.chown(name, second_uid, second_uid)
    elif planted.startswith("their reports directory"):
        reports.rmdir()
        reports.symlink_to(theirs)
        os.lchown(reports, second_uid, second_uid)
    else:
        name.symlink_to(victim)
        if planted.startswith("their symlink"):
            os.lchown(name, second_uid, second_uid)
    catalog = _catalog(tmp_path / "c.db", RUN)
    before = _tree(tmp_path)
    _refused(_report(workdir, catalog), says)
    assert _tree(tmp_path) == before
    assert victim.read_text() == "theirs\n"


# -- output files (paths.write_output), in-process --------------------------------------


def test_an_output_of_mine_is_replaced_whole_keeping_its_mode(tmp_path):
    target = tmp_path / "ledger.csv"
    target.write_text("old")
    target.chmod(0o640)
    inode = target.stat().st_ino
    paths.write_output(target, "new")
    assert target.read_text() == "new" and stat.S_IMODE(target.stat().st_mode) == 0o640
    assert target.stat().st_ino != inode  # renamed into place, not rewritten
    link = tmp_path / "latest.csv"
    link.symlink_to(target)
    assert paths.write_output(link, "newer") == target  # my own symlink: followed once
    assert link.is_symlink() and target.read_text() == "newer"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.csv", "ledger.csv"]


@pytest.mark.parametrize(
    ("where", "says"),
    [
        ("a directory", "is a directory"),
        ("missing/x.csv", "does not exist"),
        ("a file/x.csv", "is not a directory"),
    ],
)
def test_an_output_that_cannot_be_written_is_refused_and_nothing_is_made(tmp_path, where, says):
    (tmp_path / "a directory").mkdir()
    (tmp_path / "a file").write_text("x")
    before = _tree(tmp_path)
    with pytest.raises(ContextExecutorError, match=says):
        paths.write_output(tmp_path / where, "data")
    assert _tree(tmp_path) == before


def test_an_output_over_another_users_file_is_refused(tmp_path, second_uid):
    theirs = tmp_path / "theirs.csv"
    theirs.write_text("theirs")
    os.chown(theirs, second_uid, second_uid)
    with pytest.raises(UnsafePathError, match=f"belongs to uid {second_uid}"):
        paths.write_output(theirs, "mine")
    assert theirs.read_text() == "theirs" and sorted(os.listdir(tmp_path)) == ["theirs.csv"]


# -- names from the scheduler ---------------------------------------------------------


def test_a_servers_hold_file_lies_in_the_hold_directory_whatever_its_name(tmp_path):
    files = ClusterFiles(tmp_path / "cluster" / "x.json")
    for name in ("../../escape", "/abs/x", "..", ".", "cpu0"):
        hold = files.hold_file(name)
        assert hold.parent == files.hold_dir and hold.name not in ("", ".", ".."), name
    paths.private_dir(files.hold_dir)
    paths.write_private(files.hold_file("../../escape"), "4102444800")
    assert held_until(files, "../../escape") == 4102444800.0
    assert not (tmp_path / "escape").exists() and not (tmp_path / "cluster" / "escape").exists()
