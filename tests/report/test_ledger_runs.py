"""The ledger of real runs: an embedded run with injected kills (the lost bucket is
the work the kills threw away), an `up` cluster across two runs, its report opened in
headless Chromium, and the catalogs a report must explain instead of failing on."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from snakemake_executor_context.catalog.reading.ledger import read_ledger, window_of
from snakemake_executor_context.catalog.store import open_reader
from snakemake_executor_context.fleet.buckets import Bucket
from tests.browser import ARTIFACTS, open_page
from tests.catalog_builder import CatalogBuilder
from tests.conftest import BIN, TESTS, WORKFLOWS, context_run, persistent_cluster
from tests.e2e.test_preemption import _injector, _kills
from tests.fleet.test_ledger import assert_partition

pytestmark = pytest.mark.slow
DATA = TESTS / "data" / "catalogs"


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "snakemake-context"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _ledger(catalog: Path, **window):
    store = open_reader(catalog)
    try:
        with store.session() as session:
            return read_ledger(session, window_of(session, **window))
    finally:
        store.close()


def test_an_embedded_run_with_kills_accounts_every_second_and_its_report_opens(tmp_path):
    """Two servers, 12 one-second jobs, two injected SIGKILLs; --context-report. Every
    server's end is recorded, each server's buckets sum to its life, the lost bucket is
    the work of the attempts the kills threw away, and the report opens in headless
    Chromium with no console error and no request, one timeline row per server."""
    work = tmp_path / "preempt"
    shutil.copytree(WORKFLOWS / "preempt", work)
    injector = _injector(work, "--every", "3", "--alternate", "--count", "2")
    try:
        run = context_run(
            work, "--context-servers", "2", "--context-report", "--config", "count=12"
        )
    finally:
        injector.wait(timeout=60)
    run.check()
    catalog = work / ".snakemake/context/catalog.db"
    with sqlite3.connect(catalog) as db:
        (run_id,) = db.execute("select run_id from runs").fetchone()
        open_servers = db.execute("select name from servers where left is null").fetchall()
        thrown = db.execute(
            "select coalesce(sum(finished - started), 0), count(*) from attempts "
            "where outcome = 'lost' and started is not null"
        ).fetchone()
        recorded = db.execute("select coalesce(sum(seconds_lost), 0) from server_losses").fetchone()
    assert open_servers == [], "every embedded server's end is recorded at the run's end"
    assert any(kill["busy"] for kill in _kills(work)) and thrown[1] >= 1, _kills(work)
    ledger = _ledger(catalog, run=run_id)
    assert_partition(ledger)
    lost = ledger.totals().get(Bucket.LOST, 0.0)
    assert lost == pytest.approx(thrown[0], rel=0.01, abs=1e-3)
    assert lost == pytest.approx(recorded[0], rel=0.01, abs=1e-3)
    assert ledger.totals()[Bucket.RUNNING] > 0
    report = work / ".snakemake/context/reports" / f"{run_id}.html"
    assert report.exists() and str(report.relative_to(work)) in run.output.replace(
        str(work) + "/", ""
    )
    opened = open_page(
        report,
        ARTIFACTS / "ledger-embedded-run.png",
        ready="window.Bokeh && Bokeh.documents.length > 0 && Object.keys(Bokeh.index).length > 0",
        asks={
            "rows": "document.querySelectorAll('tr.server-row').length",
            "factors": "Bokeh.documents[0].get_model_by_name('timeline').y_range.factors.length",
        },
    )
    assert opened.errors == []
    assert [url for url in opened.requests if not url.startswith("file://")] == []
    servers = len(ledger.servers)
    assert opened.values == {"rows": servers, "factors": servers}


def test_an_up_cluster_across_two_runs(tmp_path):
    """Two runs on one `up` cluster: each run's ledger sums per server, the time
    between them is idle and no run's, and `down` records every server's end."""
    cluster = tmp_path / "cluster"
    with persistent_cluster(cluster, "--servers", "2") as scheduler_file:
        runs = []
        for name in ("one", "two"):
            work = tmp_path / name
            shutil.copytree(WORKFLOWS / "reuse", work)
            run = context_run(
                work,
                "--context-scheduler-file",
                str(scheduler_file),
                "--config",
                "count=4",
                "sleep=0.2",
                env={"TOY_LOAD_SECONDS": "0.5"},
            )
            run.check()
            runs.append(work)
        catalog = scheduler_file.with_suffix(".db")
        with sqlite3.connect(catalog) as db:
            run_ids = [r for (r,) in db.execute("select run_id from runs order by started")]
            started = db.execute("select min(started), max(finished) from runs").fetchone()
        for run_id in run_ids:
            ledger = _ledger(catalog, run=run_id)
            assert_partition(ledger)
            assert ledger.by("run").keys() <= {run_id, ""}
            assert ledger.totals()[Bucket.RUNNING] > 0
        both = _ledger(catalog, since=started[0], now=started[1])
        assert_partition(both)
        assert set(both.by("run")) == {*run_ids, ""}  # between the runs: no run's
        assert Bucket.IDLE_WARM in both.by("run")[""]
    with sqlite3.connect(catalog) as db:
        assert db.execute("select count(*) from servers where left is null").fetchone() == (0,)


def test_a_run_without_jobs_gets_a_report_that_says_so(tmp_path):
    catalog = tmp_path / "catalog.db"
    with CatalogBuilder(catalog) as b:
        run = b.run("empty-run", jobs_total=0)
        server = b.server("cpu0", gpu=None)
        b.tick(5)
        b.leave(server)
        b.finish_run(run)
    out = _cli("report", "--catalog", str(catalog), "-o", str(tmp_path / "r.html"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    page = (tmp_path / "r.html").read_text()
    assert "Run empty-run ran no job" in page and "idle_cold" not in page.split("<h2>")[0]


def test_a_catalog_of_the_release_before_is_refused_in_one_line_then_reported(tmp_path):
    catalog = tmp_path / "catalog.db"
    shutil.copy(DATA / "catalog-v1.sqlite", catalog)
    refused = _cli("report", "--catalog", str(catalog), cwd=tmp_path)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "snakemake-context upgrade" in refused.stderr and refused.stderr.count("\n") == 1
    assert _cli("upgrade", "--catalog", str(catalog), cwd=tmp_path).returncode == 0
    out = _cli("report", "--catalog", str(catalog), "-o", str(tmp_path / "r.html"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    with sqlite3.connect(catalog) as db:
        (run_id,) = db.execute("select run_id from runs order by started desc limit 1").fetchone()
    assert_partition(_ledger(catalog, run=run_id))


def test_report_compare_since_and_exports_from_the_command_line(tmp_path):
    catalog = tmp_path / "catalog.db"
    with CatalogBuilder(catalog) as b:
        server = b.server("gpu0")
        model = b.context("smollm2")
        for name, load in (("agnostic", True), ("full", False)):
            run = b.run(name, jobs_total=3)
            for i in range(3):
                if load or i == 0:
                    b.load(server, model, seconds=2)
                b.job(run, "score", server=server, context=model, seconds=1)
                if load:
                    b.evict(server, model)
            b.finish_run(run)
            b.tick(10)
        start = b.now
    out = _cli(
        "report", "--compare", "agnostic", "full", "--catalog", str(catalog),
        "-o", str(tmp_path / "cmp.html"), cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    page = (tmp_path / "cmp.html").read_text()
    assert "agnostic against full" in page and "loading_source" in page
    out = _cli(
        "report", "--since", str(start - 100), "--catalog", str(catalog),
        "--csv", str(tmp_path / "l.csv"), "--json", str(tmp_path / "l.json"), cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "l.csv").read_text().startswith("run,server,host,gpu_model,gpus,bucket")
    assert "reports/since-" in out.stdout
    bad = _cli("report", "--since", "yesterday", "--catalog", str(catalog), cwd=tmp_path)
    assert bad.returncode == 1 and "ISO 8601" in bad.stderr and "Traceback" not in bad.stderr
    missing = _cli("report", "--run", "nope", "--catalog", str(catalog), cwd=tmp_path)
    assert missing.returncode == 1 and "No run nope" in missing.stderr
