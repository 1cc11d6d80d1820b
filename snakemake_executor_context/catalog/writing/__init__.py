"""The catalog's write side.

- :mod:`.record`: how events become rows;
- :mod:`.writer`: the one writer thread, and how a run or a cluster opens it;
- :mod:`.lease`: one writer per SQLite catalog;
- :mod:`.follow`: a SQLite catalog deleted or replaced under its writer;
- :mod:`.sinks`: the bounded queue and thread a writer is, and the relay that sends
  an executor's events to the scheduler's writer instead.
"""
