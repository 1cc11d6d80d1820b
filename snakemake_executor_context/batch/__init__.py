"""The batch systems pilots are submitted to: one module each, behind one protocol.

- :mod:`.system`: the protocol (:class:`~.system.BatchSystem`) every batch system
  implements, the pilot job it reads (:class:`~.system.PilotJob`) and the walltime
  forms it declares;
- one module per batch system, with the facts about it that the pilots rely on:
  :mod:`.slurm`, :mod:`.sge` (Grid Engine, with its ``qsub -w v`` check and
  ``qacct``), :mod:`.pbs` (PBS Pro), :mod:`.lsf` and :mod:`.htcondor`;
- :mod:`.registry`: the systems by their ``--backend`` name (``BACKENDS``,
  ``batch_system``) and a pilot's end as its system tells it (``batch_state``).

Below the cluster: :mod:`..walltime` reads a walltime with a system's forms here, and
the settings check it before any cluster starts. Imports nothing of the project but
its errors and paths.
"""
