"""The dispatch machine: which job goes where, and when, as a pure state machine in
the style of Dask's worker state machine. Imported by the executor (Snakemake's
process), which feeds it real stimuli, and by the simulator, which feeds it simulated
ones; it imports neither Dask nor Snakemake, reads no clock and does no I/O.

- :mod:`.machine`: :class:`~.machine.Dispatch`, whose ``handle(stimulus)`` returns
  commands;
- :mod:`.vocabulary`: the stimuli it takes and the commands it returns;
- :mod:`.storylog`: every decision it took about a job, with its stimulus
  (``Dispatch.story(key)``);
- :mod:`.inflight`: what it holds of a run: queued jobs, attempts in flight, the work
  still to come per context, placement's refusals within one pass.

An attempt's end reaches the machine by two signals, and both are needed: the
server's ``JobFinished`` event (through the fleet's events) frees the attempt's slot
as soon as the server says so, and the attempt's Dask result (``AttemptEnded``) ends
the attempt and carries its outcome to Snakemake. Whichever comes first, the other is
recognised and counts nothing twice; when the event came and no result, the machine
asks for the attempt's future (``Poll``).
"""
