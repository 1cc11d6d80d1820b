"""The run report: the GPU ledger (:mod:`..catalog.reading.ledger`) as one self-contained HTML
file that opens offline, drawn with Bokeh (its JavaScript inlined).

Reads the catalog only; above the catalog and the fleet, below the command line and
the executor (which writes a run's report at its end with ``--context-report``).

- :mod:`.reportcommand`: ``snakemake-context report`` and the report a run writes itself;
- :mod:`.page`: the page: the tables as HTML, the charts embedded;
- :mod:`.timeline`: one row per server, aggregated on big fleets;
- :mod:`.charts`: throughput, fleet size, GPU-hours per GPU model, forward batches.
"""
