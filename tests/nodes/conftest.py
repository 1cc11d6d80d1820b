"""The test bed of nodes (:mod:`tests.nodes.bed`) as a fixture: it skips without root, or
fails where CI requires it (``SNAKEMAKE_CONTEXT_REQUIRE_NODES=1``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from tests.nodes.bed import Bed, bed_available, leftovers

REQUIRE_NODES = "SNAKEMAKE_CONTEXT_REQUIRE_NODES"


def need_bed() -> None:
    """Skip (or fail, where CI requires the bed) where no bed can be made."""
    why = bed_available()
    if why:
        if os.environ.get(REQUIRE_NODES) == "1":
            pytest.fail(f"{REQUIRE_NODES}=1 but {why}")
        pytest.skip(why)


@pytest.fixture
def bed() -> Iterator[Callable[[int], Bed]]:
    """``bed(n)``: a bed of n nodes, torn down after the test; the test fails if
    anything of it is left."""
    need_bed()
    made: list[Bed] = []

    def make(count: int) -> Bed:
        made.append(Bed(count).__enter__())
        return made[-1]

    yield make
    for each in made:
        each.close()
        assert leftovers(each.tag) == [], f"bed {each.tag} left {leftovers(each.tag)}"
