"""``python -m snakemake_executor_context.gang FD``: one rank's process (see :mod:`.rank`)."""

import sys

from .rank import main

sys.exit(main())
