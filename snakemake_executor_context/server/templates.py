"""A context's template on its server, around each load: the loader's cache probe,
and the check of the template before the load (:func:`..modelcache.check_before_load`:
sizes, and the digests of what changed since it was last verified). A damaged entry
is moved aside before the load, which then gets the template from a peer or the
source; each damaged entry a load finds (this check, or the loader's own
:func:`..modelcache.convert_once` and :func:`..modelcache.open_entry`) is one line in
the job's log and one :class:`~..fleet.events.CacheEntryDamaged` event (a catalog
row)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

from .. import loaders, modelcache
from ..contexts import ContextDeclaration
from ..fleet import events as ev
from ..modelcache import cachecheck

__all__ = ["checked_load", "damage_events", "probe"]

logger = logging.getLogger(__name__)


def probe(declaration: ContextDeclaration) -> bool | None:
    """The loader's cache probe (None without one, or if it fails)."""
    try:
        return loaders.cache_probe(declaration)
    except Exception as error:
        logger.debug("cache probe of %s: %r", declaration.name, error)
        return None


def damage_events(
    found: list[cachecheck.Damaged], address: str, identity: str = ""
) -> list[ev.Event]:
    """The events of the damaged entries ``found`` by the server at ``address``."""
    return [
        ev.CacheEntryDamaged(
            address=address,
            identity=identity,
            entry=damaged.entry,
            aside=damaged.aside,
            problem=damaged.problem[:2000],
        )
        for damaged in found
    ]


@contextlib.contextmanager
def checked_load(
    declaration: ContextDeclaration, address: str, emit: Callable[..., None]
) -> Iterator[None]:
    """Around a load of ``declaration`` on the server at ``address``: its template is
    checked first (a damaged one moved aside), and every damaged entry found inside
    the block is sent to ``emit`` at its end."""
    with cachecheck.watching() as found:
        try:
            entry = loaders.template_dir(declaration)
        except Exception as error:  # the load reports a loader that cannot be imported
            logger.debug("template of %s: %r", declaration.name, error)
            entry = None
        try:
            if entry is not None:
                modelcache.check_before_load(entry)
            yield
        finally:
            if found:
                emit(*damage_events(found, address, declaration.identity))
