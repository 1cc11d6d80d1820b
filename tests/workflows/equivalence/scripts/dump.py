"""Dump everything a script can see of its job, for comparison across executors."""

import json
import os
import sys
import time

import numpy  # noqa: F401  (so that its BLAS pool is loaded and counted)
import threadpoolctl

from snakemake_executor_context import load_context

toy = load_context(snakemake)
output = snakemake.output[0]

# With a barrier, every job waits here until all have started: they dump what they see
# while the others run (slots: in one server process at once).
barrier = int(snakemake.config.get("barrier", 0))
if barrier:
    os.makedirs("barrier", exist_ok=True)
    open(os.path.join("barrier", snakemake.wildcards.sample), "w").close()
    deadline = time.time() + 60
    while len(os.listdir("barrier")) < barrier and time.time() < deadline:
        time.sleep(0.05)


def named(namedlist):
    return {"items": [str(x) for x in namedlist], "names": dict(namedlist.items())}


dump = {
    "type": type(snakemake).__module__ + "." + type(snakemake).__qualname__,
    "input": named(snakemake.input),
    "output": named(snakemake.output),
    "params": {k: v for k, v in snakemake.params.items()},
    "wildcards": dict(snakemake.wildcards.items()),
    "threads": snakemake.threads,
    "resources": {k: v for k, v in snakemake.resources.items()},
    "log": named(snakemake.log),
    "config": snakemake.config,
    "rule": snakemake.rule,
    "bench_iteration": snakemake.bench_iteration,
    "scriptdir": snakemake.scriptdir,
    "cwd": os.getcwd(),
    "name": __name__,
    "file": __file__,
    "main_is_this_module": sys.modules["__main__"].__dict__ is globals(),
    "main_file": sys.modules["__main__"].__file__,
    "main_snakemake_output": str(sys.modules["__main__"].snakemake.output[0]),
    "barrier_reached": not barrier or len(os.listdir("barrier")) >= barrier,
    # What the preamble put on sys.path from the workflow (not the interpreter's own,
    # nor Snakemake's script-copy directory, which only a subprocess has first).
    "sys_path_workflow": [
        p.replace(os.getcwd(), "<CWD>")
        for p in sys.path
        if p.startswith(os.getcwd()) and ".snakemake/scripts" not in p
    ],
    "argv_len": len(sys.argv),
    "env": {
        name: os.environ.get(name)
        for name in (
            "EQUIV_TOKEN",
            "OMP_NUM_THREADS",
            "GOTO_NUM_THREADS",
            "OPENBLAS_NUM_THREADS",
            "MKL_NUM_THREADS",
            "VECLIB_MAXIMUM_THREADS",
            "NUMEXPR_NUM_THREADS",
            "TMPDIR",
            "TMP",
            "TEMP",
            "TEMPDIR",
        )
    },
    "tmpdir_is_dir": os.path.isdir(snakemake.resources.tmpdir),
    "thread_pools": sorted(
        {
            pool["internal_api"]: pool["num_threads"] for pool in threadpoolctl.threadpool_info()
        }.items()
    ),
    "stale_output_present": os.path.exists(output),
    "output_dir_present": os.path.isdir(os.path.dirname(output)),
    "log_dir_present": os.path.isdir(os.path.dirname(snakemake.log[0])),
    "context": {"scale": toy["scale"]},
    "preamble_names": sorted(n for n in ("sys", "pickle", "logger", "Snakemake") if n in globals()),
}
with open(snakemake.log[0], "w") as log:
    print("dumping", file=log)
with open(output, "w") as f:
    json.dump(dump, f, indent=1, sort_keys=True, default=str)
