"""The help screen: what each view shows and the keys."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

HELP = """\
# snakemake-context monitor

A live view of a context catalog: the fleet of context servers, the contexts loaded
on them, what was lost, throughput and the current run's progress. It only reads.

- `f` **Fleet**: servers grouped by GPU model (count, memory, busy and free slots,
  contexts, jobs, throughput), then each server; `Enter` opens a server's page. When
  no run and no server is live, the last run's servers, ended (when each left).
- `c` **Contexts**: which context is warm on which server, load time, cache hits,
  evictions.
- `l` **Losses**: servers lost and joined, the jobs each loss sent back and the work
  it cost, with running totals.
- `t` **Throughput**: jobs/min over time, overall and per GPU model; `w` changes the
  window (5 min, 15 min, 1 h, all); when no run is live it covers the last run.
- `g` **Ledger**: where the latest run's GPU-seconds went (useful work, loading, idle
  warm and cold, lost, failed, the rest), by GPU model and by context, live.
- `p` **Progress**: the current run's jobs done of planned, failures, ETA; recent runs.
- `r` read the catalog now; `ctrl+p` the command palette; `?` this help (`Esc` closes
  it); `q` quit.

The top line shows the catalog, how old the data is and how long the last read took.
A run whose writer's heartbeat stopped for a minute is marked **STALE**; a quiet run
whose jobs are merely long is not.
"""


class HelpScreen(ModalScreen[None]):
    """Keys and views."""

    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            yield Markdown(HELP)
