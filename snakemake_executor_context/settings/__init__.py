"""The settings: every option of the servers and pilots declared once, its checks, and
the fleet's shape. Every front end (the executor's ``--context-*`` flags, ``up``'s,
the cluster process's, the simulator's) is made from here.

- :mod:`.table`: the option table (``OPTIONS``), each option's default, help and what
  it allows, the tuning keys behind ``--context-tuning``, the environment variables a
  user may export;
- :mod:`.checks`: what a setting allows (:class:`~.checks.Allowed`), how a value is
  parsed and refused in one line naming the setting;
- :mod:`.shape`: the fleet's shape (:class:`~.shape.Shape`): slots per server, threads
  per slot, GPUs per server, the model caches, template sharing.

Below the pilots and above the batch systems' facts (their names and walltime forms,
:mod:`..pilots.batch`): the checks read a walltime as the named system does.
"""
