"""``python -m snakemake_executor_context.paths --shell``: the private root and Dask's
scratch space on this node as shell ``export`` lines (a pilot's job script evaluates
them before its worker starts), or one line on stderr and status 2."""

from __future__ import annotations

import shlex
import sys

from ..errors import UnsafePathError
from .root import LOCAL_DIR_VARIABLE, local_base, scratch_dir


def _shell() -> int:
    """Print the root and the scratch space as shell ``export`` lines (a pilot's job
    script evaluates them on its node), or one line on stderr and status 2."""
    try:
        scratch = scratch_dir()
    except UnsafePathError as error:
        print(f"snakemake-context: {error}", file=sys.stderr)
        return 2
    print(f"export {LOCAL_DIR_VARIABLE}={shlex.quote(str(local_base()))}")
    print(f"export DASK_TEMPORARY_DIRECTORY={shlex.quote(str(scratch))}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] != ["--shell"]:
        print("usage: python -m snakemake_executor_context.paths --shell", file=sys.stderr)
        sys.exit(2)
    sys.exit(_shell())
