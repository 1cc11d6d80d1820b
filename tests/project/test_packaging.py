"""The plugin is discoverable, cheap to import, pins its common settings, and its wheel
ships the license."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from tests.conftest import BIN, REPO

HEAVY = ("distributed", "dask", "torch", "transformers", "textual", "sqlalchemy")


def test_discovery_package_imports_nothing_heavy():
    code = (
        "import sys, snakemake_executor_plugin_context, snakemake_executor_context\n"
        f"heavy = sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_snakemake_finds_the_plugin_and_lists_its_settings():
    out = subprocess.run(
        [str(BIN / "snakemake"), "--executor", "context", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    for flag in (
        "--context-scheduler-address",
        "--context-scheduler-file",
        "--context-servers",
        "--context-contexts-memory",
        "--context-catalog",
        "--context-tuning",
        "--context-credentials",
        "--context-allow-plaintext",
    ):
        assert flag in out.stdout


def test_every_setting_has_help_and_a_default():
    from dataclasses import MISSING, fields

    from snakemake_executor_context.executor.settings import ExecutorSettings

    for field in fields(ExecutorSettings):
        assert field.metadata.get("help"), field.name
        assert field.default is not MISSING or field.default_factory is not MISSING, field.name


def test_common_settings_are_pinned():
    from snakemake_executor_plugin_context import common_settings

    assert common_settings.non_local_exec is True
    assert common_settings.implies_no_shared_fs is False
    assert common_settings.job_deploy_sources is False
    assert common_settings.auto_deploy_default_storage_provider is False


def test_console_script():
    out = subprocess.run(
        [str(BIN / "snakemake-context"), "--help"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0
    assert all(command in out.stdout for command in ("up", "down", "status"))


def test_the_wheel_ships_the_license(tmp_path: Path):
    # pip builds the wheel as CI does (.ci/run), with the backend pyproject.toml names:
    # hatchling, in an isolated environment (a second or so once pip has cached it). The
    # sdist, which nothing here builds, takes the license-files of pyproject.toml too.
    pip = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps"]
    out = subprocess.run(
        [*pip, "-w", str(tmp_path), str(REPO)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    (wheel,) = tmp_path.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (license_file,) = [name for name in archive.namelist() if name.endswith("/LICENSE")]
        assert license_file.endswith(".dist-info/licenses/LICENSE"), license_file
        assert archive.read(license_file) == (REPO / "LICENSE").read_bytes()
        (metadata,) = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
        headers = archive.read(metadata).decode().splitlines()
    assert "License-Expression: MIT" in headers
    assert "License-File: LICENSE" in headers
