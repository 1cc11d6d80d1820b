"""The node-local model cache: a loader's converted weights and staged model files,
kept so that nothing another user planted is loaded (standard library only).

- :mod:`.entries`: the cache's entries: made once per node and user
  (:func:`~.entries.convert_once`), probed, opened, held while in use; its public
  functions are this package's (``from snakemake_executor_context import modelcache``
  in a loader);
- :mod:`.manifest`: what a directory of files holds, by relative path, size and sha256;
- :mod:`.cachecheck`: whether an entry still holds what its recorded manifest says,
  and a damaged one moved aside;
- :mod:`.cacheroom`: the cache's size limit, the entries in use, and the least
  recently used ones removed to make room;
- :mod:`.staging`: a loader's model argument copied once into the cache, and the
  loader handed the copy.

Imports the private paths (:mod:`..paths`), the defaults and the errors; servers,
pilots' nodes and the executor (a staging check at start) import it.
"""

from .entries import (
    DEFAULT_MODEL_CACHE,
    MODEL_CACHE_VARIABLE,
    Damage,
    cache_root,
    check_before_load,
    convert_once,
    entry_problem,
    file_sha256,
    hold_entry,
    is_cached,
    make_room,
    manifest_path,
    open_entry,
    recorded_manifest,
)

__all__ = [
    "DEFAULT_MODEL_CACHE",
    "MODEL_CACHE_VARIABLE",
    "Damage",
    "cache_root",
    "check_before_load",
    "convert_once",
    "entry_problem",
    "file_sha256",
    "hold_entry",
    "is_cached",
    "make_room",
    "manifest_path",
    "open_entry",
    "recorded_manifest",
]
