"""Snakemake's own test base for executor plugins (simple and group workflows)."""

from __future__ import annotations

import pytest
from snakemake.common.tests import TestWorkflowsLocalStorageBase
from snakemake_interface_executor_plugins.settings import ExecutorSettingsBase

from snakemake_executor_context.executor.settings import ExecutorSettings

pytestmark = pytest.mark.slow


class TestWorkflows(TestWorkflowsLocalStorageBase):
    """Runs Snakemake's reference workflows (plain jobs only) through this executor."""

    __test__ = True

    def get_executor(self) -> str:
        return "context"

    def get_executor_settings(self) -> ExecutorSettingsBase | None:
        return ExecutorSettings(servers=2)
