"""Stray processes, in one place: what a job, a context or a dead server left running,
found, ended and named. No process a job starts outlives it.

- :mod:`.processes`: process work written once (is a pid alive, stopping a tree, the
  facts of ``/proc``, ending a decision's processes, child subreapers), used by every
  process of the project;
- :mod:`.decisions`: which processes are strays, pure decisions over their facts;
- :mod:`.jobsweep`: in a server, what its jobs and contexts leave running, ended at
  their end and named in their logs;
- :mod:`.processgroups`: in a server, its plain jobs' process groups recorded on local
  disk, so that what a dead server left is found;
- :mod:`.nannysweep`: in the process above a server (the cluster's, a pilot's nanny),
  what a server that died left, ended before it starts again.

Imports the shared job specs, paths and defaults, and the fleet's vocabulary only.
"""
