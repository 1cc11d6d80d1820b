"""Discovery package for ``snakemake --executor context``.

Snakemake finds executor plugins by ``pkgutil.iter_modules()`` on directory packages
named ``snakemake_executor_plugin_<name>``; this one only re-exports. The code lives
in :mod:`snakemake_executor_context`.
"""

from snakemake_executor_context.executor.adapter import Executor
from snakemake_executor_context.executor.settings import ExecutorSettings, common_settings

__all__ = ["Executor", "ExecutorSettings", "common_settings"]
