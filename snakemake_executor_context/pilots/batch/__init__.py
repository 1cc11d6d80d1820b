"""The batch systems pilots are submitted to: one module each, behind one protocol.

- :mod:`.system`: the protocol (:class:`~.system.BatchSystem`) every batch system
  implements, the pilot job it reads (:class:`~.system.PilotJob`) and the walltime
  forms it declares;
- one module per batch system, with the facts about it that the pilots rely on:
  :mod:`.slurm`, :mod:`.sge` (Grid Engine, with its ``qsub -w v`` check and
  ``qacct``), :mod:`.pbs` (PBS Pro), :mod:`.lsf` and :mod:`.htcondor`;
- :mod:`.registry`: the systems by their ``--backend`` name (``BACKENDS``,
  ``batch_system``) and a pilot's end as its system tells it (``batch_state``).

- :mod:`.walltime`: a walltime read as a system reads it, with its forms here; the
  settings check it before any cluster starts.

Below the settings: imports nothing of the project but its errors and paths.
"""
