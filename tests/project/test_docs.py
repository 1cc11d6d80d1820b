"""The docs site builds with MkDocs in strict mode, and a broken link, a missing anchor, a
link to a missing page or a page left out of the nav fails the build. MkDocs builds from
local files only (its theme is bundled): no network; about a second per build."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]' (.ci/setup)")


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of the site configured in ``root/mkdocs.yml``.

    Never with ``-q``: MkDocs counts the warnings it logs, so a quiet strict build passes.
    """
    config = ["--config-file", str(root / "mkdocs.yml"), "--site-dir", str(site)]
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", *config],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_site_builds_in_strict_mode(tmp_path):
    result = build(REPO, tmp_path / "site")
    assert result.returncode == 0, result.stderr
    pages = sorted(path.stem for path in (REPO / "docs").glob("*.md"))
    for page in pages:
        html = tmp_path / "site" / ("index.html" if page == "index" else f"{page}/index.html")
        assert html.is_file(), page
    for image in (REPO / "docs/images").iterdir():
        assert (tmp_path / "site/images" / image.name).is_file(), image.name


@pytest.mark.parametrize(
    ("plant", "message"),
    [
        ("a [broken anchor](slots.md#no-such-heading)", "does not contain an anchor"),
        ("a [same-page anchor](#no-such-heading)", "no such anchor on this page"),
        ("a [missing page](no-such-page.md)", "not found among documentation files"),
        ("a [source file](../README.md)", "not found among documentation files"),
        ("an [absolute link](/slots/)", "absolute link"),
        (None, 'not included in the "nav" configuration'),
    ],
    ids=["anchor", "same-page-anchor", "missing-page", "outside-docs", "absolute", "not-in-nav"],
)
def test_strict_build_fails_on_a_broken_link(tmp_path, plant, message):
    shutil.copy(REPO / "mkdocs.yml", tmp_path)
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    if plant is None:
        (tmp_path / "docs/orphan.md").write_text("# A page nobody added to the nav\n")
    else:
        with (tmp_path / "docs/index.md").open("a") as index:
            index.write(f"\n{plant}\n")
    result = build(tmp_path, tmp_path / "site")
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
