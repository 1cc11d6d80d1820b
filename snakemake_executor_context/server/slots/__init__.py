"""A server's slots: which of its jobs run at once, in one place.

A server offers N slots (Dask runs up to N of its tasks at once, one thread each).
One job's way through them: :class:`.serverslots.ServerSlots` (the server's one slots
object) admits the job at its :class:`.gate.SlotGate`, which blocks the job's thread
until the pure policy :func:`.gate.may_start` lets it run beside the jobs running
(the same *group*, :func:`.sharing.group_of`; a context's limit of jobs at once; an
unshareable context alone); the job then runs with the process state its group
shares (:class:`.sharing.SharedGroup`: cwd, environment, ``sys.path``, thread pools,
a ``__main__`` per job); at its end ServerSlots settles what the job measured (its
context's working memory per job, and so how many of its jobs fit at once,
:func:`.gate.fitting_slots`).

- :mod:`.gate`: the policy and the gate (standard library only: the GPU check
  script loads this file by path);
- :mod:`.sharing`: what concurrent jobs of one group share;
- :mod:`.serverslots`: :class:`~.serverslots.ServerSlots`, the gate, the shared group
  and each context's memory-based limit together.
"""
