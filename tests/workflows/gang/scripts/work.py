import json
import os
import time

from snakemake_executor_context import load_context

toy = load_context(snakemake)
me = snakemake.wildcards.i
started = time.time()
barrier = int(snakemake.params.barrier)
if barrier:  # proves overlap: waits until that many jobs have started
    os.makedirs("barrier", exist_ok=True)
    open(f"barrier/{me}", "w").close()
    deadline = time.time() + 60
    while len(os.listdir("barrier")) < barrier and time.time() < deadline:
        time.sleep(0.05)
    if len(os.listdir("barrier")) < barrier:
        raise RuntimeError("barrier not reached: jobs did not overlap")
where = toy.where()
os.makedirs("running", exist_ok=True)
with open(f"running/{me}.json", "w") as marker:  # the test's signal: ranks are busy
    json.dump(where, marker)
value = toy.total(float(me), hold=float(snakemake.params.hold))
with open(snakemake.output[0], "w") as out:
    json.dump(
        {
            "value": value,
            "where": where,
            "server_pid": os.getpid(),
            "started": started,
            "ended": time.time(),
        },
        out,
    )
with open("writes.txt", "a") as writes:  # once per successful job: nothing runs twice
    writes.write(f"{me}\n")
