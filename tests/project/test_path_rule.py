"""No path is opened, made or handed to Dask by code that bypasses the one path rule
(snakemake_executor_context.paths): the package is searched for ``open(``,
``mkdir``/``makedirs``, ``tempfile``, reads and writes of whole files, and Dask's
``local_directory`` outside that package, and every finding must be in the short
allow-list below, which says why it may be there. Read from the syntax tree, so a
comment or a docstring that names them does not count, and an entry that no longer
matches anything must go.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("snakemake_executor_context", "snakemake_executor_plugin_context")
RULE = "snakemake_executor_context/paths/"

#: Methods that open, make or read and write a path.
CALLS = {
    "open",
    "mkdir",
    "makedirs",
    "write_text",
    "write_bytes",
    "read_text",
    "read_bytes",
    "copyfile",
    "mkstemp",
    "mkdtemp",
}

WORKFLOW_DIRECTORY = "in the workflow directory (Snakemake's rules: outputs, job logs)"

#: (module, what) -> why it may bypass the rule.
ALLOWED = {
    ("simulate/scenario.py", "read_text"): "a preemption trace the user names (simulate "
    "--preempt-trace), read as data, never run",
    ("simulate/workload.py", "read_text"): "the workload spec the user names, read as "
    "data (YAML), never run",
    ("snakemake_internals.py", "read_text"): "the installed Snakemake's own modules, read "
    "to check the shape of its classes at start",
    ("snakemake_internals.py", "tempfile"): "a job's resources.tmpdir on its server: the "
    "job's own temporary directory, Snakemake's, not the plugin's",
    ("catalog/store.py", "read_text"): "the mount table, /proc/self/mounts (the kernel's)",
    ("catalog/store.py", "mkdir"): "the directory of a catalog the user named, or the "
    "workflow's .snakemake/context (umask); the files in it are made 0600 and checked, "
    "or live in the private root when others may write there",
    ("catalog/writing/follow.py", "mkdir"): "the directory of a catalog deleted under its writer, "
    "made again (umask) as catalog/store.py makes it; the file in it is made 0600",
    ("catalog/writing/lease.py", "mkdir"): "the same directory, for the catalog's writer lease",
    ("server/slots/serverslots.py", "open"): "/proc/self (the kernel's)",
    ("cluster/infofiles.py", "open"): "/proc/<pid> (the kernel's)",
    ("strays/processes.py", "open"): "/proc/<pid> (the kernel's)",
    ("server/output.py", "open"): "a descriptor the job's output goes to, not a path",
    ("server/plain.py", "open"): f"a plain job's log {WORKFLOW_DIRECTORY}",
    ("server/zygote.py", "open"): f"a job's log {WORKFLOW_DIRECTORY}; /dev/null",
    ("strays/jobsweep.py", "open"): f"a job's log {WORKFLOW_DIRECTORY}, a line appended at its end",
    ("server/inprocess.py", "open"): f"a job's log {WORKFLOW_DIRECTORY}",
    ("server/groupjob.py", "open"): f"a group's log {WORKFLOW_DIRECTORY}",
    ("server/processwide.py", "open"): f"a job's log {WORKFLOW_DIRECTORY}, made with the "
    "server's umask",
    ("server/processwide.py", "mkdir"): f"the directories of a job's log and outputs "
    f"{WORKFLOW_DIRECTORY}, made with the server's umask",
    ("server/inprocess.py", "makedirs"): f"output directories, .snakemake/scripts/ "
    f"{WORKFLOW_DIRECTORY}",
    ("server/inprocess.py", "mkstemp"): "the script's copy in .snakemake/scripts/, as "
    "Snakemake makes it (exclusive, 0600)",
    ("server/inprocess.py", "tempfile"): "a job's resources.tmpdir: the job's own "
    "temporary directory, Snakemake's, not the plugin's",
    ("server/isolation.py", "tempfile"): "the same: a job's tempfile.tempdir, set and "
    "restored around it",
    ("server/isolation.py", "makedirs"): "the job's own temporary directory",
    ("loaders.py", "read_bytes"): "the workflow's loader files, hashed for a context's "
    "identity (code the run executes anyway)",
    ("modelcache/staging.py", "open"): "a staged source's files, the model the user declared, read "
    "only; the copies are made O_EXCL | O_NOFOLLOW, 0600, in the new private directory "
    "modelcache.convert_once made (paths.new_private_dir)",
    ("modelcache/staging.py", "mkdir"): "subdirectories (0700) of that new private directory",
    ("modelcache/staging.py", "read_text"): "refs/<revision> of the user's Hugging Face cache, a "
    "commit hash read as data",
    ("cluster/serve.py", "tempfile"): "tempfile.tempdir set to the private root's tmp/",
    ("cluster/join.py", "tempfile"): "tempfile.tempdir set to the private root's tmp/",
    ("cluster/join.py", "local_directory"): "Dask's temporary-directory set to the private "
    "root's scratch space (paths.scratch_dir) in the joined node's process",
    ("cluster/nannies.py", "local_directory"): "the private root's scratch space "
    "(paths.scratch_dir, given by serve and join) for each nanny and its server",
    ("cluster/serve.py", "local_directory"): "the private root's scratch space "
    "(paths.scratch_dir) for the scheduler and every nanny and server",
    ("pilots/batch/sge.py", "tempfile"): "the job script `qsub -w v` checks, in a new "
    "directory (mkdtemp) in the private root's tmp/",
    ("pilots/batch/sge.py", "write_text"): "that job script, in that directory",
    ("server/peers/holder.py", "open"): "a template's files for a peer: os.open directory by "
    "directory with O_NOFOLLOW from the cache entry modelcache checked, only the paths of "
    "its recorded manifest (never a path a request names)",
    ("server/peers/receiver.py", "open"): "a received template's files, os.open O_EXCL|O_NOFOLLOW "
    "0600 inside the new private staging directory modelcache.convert_once made "
    "(paths.new_private_dir), directory by directory from a descriptor of it (openat)",
    ("server/peers/receiver.py", "mkdir"): "that staging directory's subdirectories (0700), "
    "made from a descriptor of their parent (mkdirat)",
    ("pilots/request.py", "local_directory"): "the pilot's scratch space, as its job "
    "script made and checked it on the node (python -m ...paths --shell)",
}


def _findings(path: Path) -> set[str]:
    """What in one module opens, makes or reads a path, or sets Dask's local directory."""
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            function = node.func
            if isinstance(function, ast.Name) and function.id == "open":
                found.add("open")
            elif isinstance(function, ast.Attribute) and function.attr in CALLS:
                found.add(function.attr)
            for keyword in node.keywords:
                if keyword.arg == "local_directory":
                    found.add("local_directory")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "tempfile":
                found.add("tempfile")
        elif isinstance(node, ast.Constant) and node.value in (
            "local_directory",
            "--local-directory",
            "temporary-directory",
        ):
            found.add("local_directory")
    return found


def test_the_search_finds_what_it_looks_for():
    """The search would pass on code it cannot read: show it finds each kind."""
    sample = REPO / "snakemake_executor_context" / "paths" / "files.py"
    assert {"mkstemp", "mkdtemp", "tempfile"} <= _findings(sample)
    serve = REPO / "snakemake_executor_context" / "cluster" / "serve.py"
    assert "local_directory" in _findings(serve)


def test_nothing_bypasses_the_path_rule():
    unexplained = []
    used = set()
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            if relative.startswith(RULE):
                continue
            module = relative.removeprefix("snakemake_executor_context/")
            for what in sorted(_findings(path)):
                if (module, what) in ALLOWED:
                    used.add((module, what))
                else:
                    unexplained.append(f"{relative}: {what}")
    assert not unexplained, (
        "Paths outside the workflow directory go through snakemake_executor_context.paths "
        f"(or get an allow-list entry that says why not): {unexplained}"
    )
    assert not set(ALLOWED) - used, f"allow-list entries that match nothing: {set(ALLOWED) - used}"
