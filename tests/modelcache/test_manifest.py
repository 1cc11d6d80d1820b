"""The manifest format (snakemake_executor_context.manifest): built from a directory,
written and read back, and a directory verified against it, each failure one line."""

from __future__ import annotations

import json
import os
import stat

import pytest

from snakemake_executor_context.errors import ManifestError
from snakemake_executor_context.modelcache.manifest import FORMAT, VERSION, Manifest


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "model"
    (root / "sub").mkdir(parents=True)
    (root / "config.json").write_text('{"a": 1}')
    (root / "sub" / "weights.bin").write_bytes(b"\x01" * 4096)
    return root


def test_a_manifest_lists_relative_paths_sizes_and_digests(tree, tmp_path):
    manifest = Manifest.build(tree)
    data = json.loads(manifest.to_json())
    assert data["format"] == FORMAT and data["version"] == VERSION
    assert [f["path"] for f in data["files"]] == ["config.json", "sub/weights.bin"]
    assert data["files"][1]["size"] == 4096 and len(data["files"][1]["sha256"]) == 64
    assert manifest.total_bytes == 4096 + 8
    assert Manifest.from_json(manifest.to_json()) == manifest
    manifest.write(tmp_path / "m.json")
    assert stat.S_IMODE(os.stat(tmp_path / "m.json").st_mode) == 0o600
    assert Manifest.read(tmp_path / "m.json") == manifest
    assert Manifest.read(tmp_path / "none.json") is None
    manifest.verify(tree)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda t: (t / "config.json").unlink(), "config.json: missing"),
        (lambda t: (t / "extra").write_text("x"), "extra: not in the manifest"),
        (lambda t: (t / "config.json").write_text('{"a": 2}'), "config.json: sha256"),
        (lambda t: (t / "config.json").write_text("{}"), "config.json: 2 bytes, the manifest"),
        (lambda t: (t / "link").symlink_to(t / "config.json"), "link is a symlink"),
    ],
)
def test_a_directory_that_differs_fails_in_one_line(tree, change, says):
    manifest = Manifest.build(tree)
    change(tree)
    with pytest.raises(ManifestError) as caught:
        manifest.verify(tree)
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_sizes_only_is_a_cheap_check(tree):
    manifest = Manifest.build(tree)
    (tree / "config.json").write_text('{"a": 2}')  # same size
    manifest.verify(tree, digests=False)
    with pytest.raises(ManifestError, match="sha256"):
        manifest.verify(tree)


@pytest.mark.parametrize(
    "files",
    [
        [{"path": "../escape", "size": 1, "sha256": "0" * 64}],
        [{"path": "/abs", "size": 1, "sha256": "0" * 64}],
        [{"path": "a", "size": -1, "sha256": "0" * 64}],
        [{"path": "a", "size": 1, "sha256": "xyz"}],
        [{"path": "a", "size": 1, "sha256": "0" * 64}] * 2,
        [{"path": "a", "size": 1, "sha256": "0" * 64, "symlink": "/etc/passwd"}],
        [
            {"path": "a", "size": 1, "sha256": "0" * 64},
            {"path": "a/b", "size": 1, "sha256": "0" * 64},
        ],
        [{"path": "a\nb", "size": 1, "sha256": "0" * 64}],
        [{"path": "x" * 256, "size": 1, "sha256": "0" * 64}],
        [{"path": 7, "size": 1, "sha256": "0" * 64}],
        [{"path": "a", "size": True, "sha256": "0" * 64}],
    ],
)
def test_a_malformed_manifest_is_refused(files):
    """What a peer may send: paths that are not plain relative ones inside the
    directory, a name twice or as another's directory, fields other than a file's."""
    text = json.dumps({"format": FORMAT, "version": VERSION, "files": files})
    with pytest.raises(ManifestError, match="manifest") as refused:
        Manifest.from_json(text)
    assert "\n" not in str(refused.value)
    with pytest.raises(ManifestError, match="manifest"):
        Manifest.from_json(json.dumps({"format": "other", "version": 1, "files": []}))
