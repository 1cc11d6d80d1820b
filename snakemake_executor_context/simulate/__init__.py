"""The fleet simulated: the real dispatch machine driven through simulated time.

On top of the executor in the layer graph (it imports the executor's dispatch
machine and the fleet's policy, nothing imports it but the command line):

- :mod:`.engine`: :class:`~.engine.Simulation`, the executor's adapter played in
  simulated time around the real :class:`~..dispatch.machine.Dispatch`;
- :mod:`.release`: Snakemake's side (ready jobs, ``--jobs``, its own time per job);
- :mod:`.simservers`: a simulated context server (the real slot gate and eviction
  order), with :mod:`.hosting` (its attempts, contexts, turns at a shared source, and
  what it needs of its simulation); :mod:`.shared`: a capacity shared by its users
  (a filesystem's bandwidth, a GPU's slots); :mod:`.simpool`: a pool of pilots sized
  by the real pool policy; :mod:`.preempt`: preemptions by rate, trace or the end
  of a server's life, drawn from its partition's hazard (:mod:`.hazard`);
  :mod:`.clock`: simulated time;
- :mod:`.model`: what a simulation is told (times, fleet, pool, preemption,
  options), with :mod:`.simdefaults` (the plugin's defaults, read from its option
  table); :mod:`.workload`: the jobs, from a YAML spec; :mod:`.snakefile`: the
  jobs of a real Snakefile, from Snakemake's own DAG; :mod:`.measured`: times and
  runs read from a catalog;
- :mod:`.simledger` and :mod:`.result`: where the GPU-seconds went (the servers' lives
  accounted by the fleet's ledger, in its buckets), and what a run took;
- :mod:`.replay`: a measured run replayed, predicted against measured;
  :mod:`.simcommand`: the
  ``snakemake-context simulate`` command, :mod:`.flags` (its flags, each with what it
  allows), :mod:`.bounds` (the values' bounds: what keeps a simulation finite; the
  flags that hold several values read), :mod:`.scenario` (its arguments made a
  simulation) and :mod:`.whatif` (what is missing, the table over GPU counts).
"""
