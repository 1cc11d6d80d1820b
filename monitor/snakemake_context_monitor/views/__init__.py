"""One view (a widget) per module; each has ``show(snapshot)``.

- :mod:`.fleet`, :mod:`.contexts`, :mod:`.losses`, :mod:`.throughput`,
  :mod:`.ledger`, :mod:`.progress`: the six views, one key each;
- :mod:`.server`: a server's page (and a job's story);
- :mod:`.help`: the keys; :mod:`.base`: what every view does with a poll's update.
"""
