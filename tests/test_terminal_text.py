"""What the plugin prints of a workflow's or a catalog's values reaches the terminal
with its control characters escaped: an ESC sequence in a wildcard value, a server or
context name, a loss reason, is shown, never run by the terminal.

``status`` and ``story`` are the real commands, on a catalog the catalog's own
recording code wrote (tests/catalog_builder.py); the monitor's side is in
tests/monitor/test_monitor.py.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from snakemake_executor_context.errors import ContextExecutorError, SettingError
from snakemake_executor_context.terminal import printable, shown, shown_values
from tests.catalog_builder import CatalogBuilder
from tests.conftest import BIN

#: What a terminal acts on: C0 controls but newline, DEL, C1 controls, and the
#: bidirectional overrides.
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
RED = "\x1b[31mRED\x1b[0m"
#: A wildcard value that recolours, retitles the window (OSC, ended by BEL), moves
#: the cursor by a C1 CSI, reverses the text, and carries Rich/Textual markup.
EVIL = f"{RED}\x1b]0;owned\x07\x9b2J\u202eevil[bold]b[/bold][/x]"


def test_one_value_is_shown_with_every_control_escaped():
    assert shown(RED) == "\\x1b[31mRED\\x1b[0m"
    assert shown("a\nb\tc\rd\x7f\x9b\u202e") == "a\\nb\\tc\\rd\\x7f\\x9b\\u202e"
    assert printable("line one\n\tline two\x1b[2J") == "line one\n\tline two\\x1b[2J"
    assert shown("plain [bold]text[/bold] é") == "plain [bold]text[/bold] é"
    assert shown(3) == "3"
    data = {"name\x1b": [RED, ("a\x07", 1)], "n": None}
    assert shown_values(data) == {"name\\x1b": ["\\x1b[31mRED\\x1b[0m", ("a\\x07", 1)], "n": None}


def test_an_error_message_carries_no_control_character():
    error = SettingError(f"--context-name {EVIL!s} is not allowed")
    assert not CONTROL.search(str(error)), repr(str(error))
    assert "\\x1b[31mRED" in str(error)
    assert isinstance(error, ContextExecutorError)
    multi = ContextExecutorError("first line\nsecond \x1b[2K line")
    assert str(multi) == "first line\nsecond \\x1b[2K line"  # its own line breaks kept


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The catalog, and the attempt key of its lost job."""
    path = tmp_path_factory.mktemp("evil") / "c.db"
    with CatalogBuilder(path) as b:
        run = b.run("20261201T070021-4242", jobs_total=2, workdir=f"/work/{RED}")
        server = b.server(f"gpu{RED}", host=f"node{RED}")
        model = b.context(f"smollm2{RED}")
        b.load(server, model)
        b.job(run, "score", server=server, context=model, wildcards={"shard": EVIL})
        lost = b.start_job(run, f"rule{RED}", server=server, context=model)
        b.lose_server(server, reason=f"lost {RED}")
        b.finish_run(run, ok=False)
    return path, lost


def _cli(*args: str) -> str:
    run = subprocess.run(
        [str(BIN / "snakemake-context"), *args], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    return run.stdout + run.stderr


def _clean(output: str) -> None:
    found = CONTROL.search(output)
    assert found is None, f"raw {found.group()!r} in:\n{output!r}"


def test_status_shows_the_catalogs_values_escaped(catalog):
    output = _cli("status", "--catalog", str(catalog[0]))
    _clean(output)
    assert "gpu\\x1b[31mRED\\x1b[0m" in output  # the server's name, visibly escaped
    assert "smollm2\\x1b[31mRED" in output and "lost \\x1b[31mRED" in output
    assert "shard=\\x1b[31mRED" in output and "\\u202eevil[bold]b[/bold][/x]" in output
    assert "\\x1b]0;owned\\x07\\x9b2J" in output


def test_story_shows_the_catalogs_values_escaped(catalog):
    output = _cli("story", "score", "--catalog", str(catalog[0]))
    _clean(output)
    assert output.startswith("score(shard=\\x1b[31mRED\\x1b[0m\\x1b]0;owned\\x07")
    assert "on gpu\\x1b[31mRED\\x1b[0m" in output
    lost = _cli("story", catalog[1], "--catalog", str(catalog[0]))  # by its attempt key
    _clean(lost)
    assert "rule\\x1b[31mRED" in lost


def test_a_story_not_found_names_the_value_escaped(catalog):
    run = subprocess.run(
        [str(BIN / "snakemake-context"), "story", f"nope{RED}", "--catalog", str(catalog[0])],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1 and "nope\\x1b[31mRED" in run.stderr, run.stderr
    _clean(run.stderr)


def test_what_the_executor_tells_snakemake_is_escaped():
    """A job's title (its wildcards), the errors and log lines the dispatch machine
    hands Snakemake: made by the executor's own code, shown escaped. A stand-in for a
    Snakemake job (the two attributes the title reads): a real run prints the same
    wildcards raw in Snakemake's own job lines, which are Snakemake's."""
    from types import SimpleNamespace

    from snakemake_executor_context.dispatch import vocabulary as v
    from snakemake_executor_context.executor.jobbuild import label, title

    job = SimpleNamespace(
        is_group=lambda: False, rule=SimpleNamespace(name="score"), wildcards_dict={"s": EVIL}
    )
    assert title(job).startswith("Rule 'score' (s=\\x1b[31mRED") and label(job) == "rule 'score'"
    assert not CONTROL.search(title(job))
    ticket = v.JobTicket(key="score-1-a1-00000001", label=label(job), title=title(job), rule="x")
    failed = v.ReportError(ticket, f"{RED}: failed\nits log ends:\n\x1b[2Jx")
    assert failed.message == "\\x1b[31mRED\\x1b[0m: failed\nits log ends:\n\\x1b[2Jx"
    logged = v.Log("warning", f"server gpu{RED} lost")
    assert logged.message == "server gpu\\x1b[31mRED\\x1b[0m lost"


@pytest.mark.parametrize(
    ("nbytes", "text"),
    [
        (0, "0 B"),
        (999, "999 B"),
        (1000, "1.00 kB"),
        (9_996, "10.0 kB"),
        (12_000_000, "12.0 MB"),
        (538_000_000, "538 MB"),
        (999_600_000, "1.00 GB"),
        (141e9, "141 GB"),
        (-2.5e9, "-2.50 GB"),
        (5e18, "5000 PB"),
    ],
)
def test_a_byte_count_is_shown_in_decimal_units_to_three_digits(nbytes, text):
    """One rendering of sizes everywhere: decimal units, as "8GB" means 8e9 bytes to
    the settings, and three significant digits, rounding carried into the next unit."""
    from snakemake_executor_context.terminal import format_bytes

    assert format_bytes(nbytes) == text
