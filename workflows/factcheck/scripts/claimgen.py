"""A deterministic, exactly balanced SUPPORTS/REFUTES claim set in FEVER's schema.

The facts come from well-kept packages' data: the periodic table (``periodictable``)
and ISO 3166 countries and subdivisions (``pycountry``). Each family of claims states a
relation; a REFUTES claim pairs a subject with another subject's value, chosen so that
the data says it is false. Every record carries the fact it was made from (``fact``),
so a test can check it against the data independently.

    python claimgen.py --n 2000 --seed 7 --out claims.jsonl
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable, Iterator
from typing import Any

SUPPORTS, REFUTES = "SUPPORTS", "REFUTES"

Fact = tuple[str, str, str]  # (family, subject, value)


def _elements() -> list[Any]:
    import periodictable

    return sorted((e for e in periodictable.elements if e.number > 0), key=lambda e: e.number)


def _countries() -> list[Any]:
    import pycountry

    return sorted(pycountry.countries, key=lambda c: c.alpha_3)


def _name(country: Any) -> str:
    """The common name where ISO has one ("Korea, Republic of" is "South Korea")."""
    return str(getattr(country, "common_name", None) or country.name)


def facts() -> dict[str, list[Fact]]:
    """True facts by family, sorted (so a seed gives the same claims everywhere)."""
    import pycountry

    elements, countries = _elements(), _countries()
    by_code = {c.alpha_2: c for c in countries}
    families: dict[str, list[Fact]] = {
        "element_symbol": [("element_symbol", e.name.capitalize(), e.symbol) for e in elements],
        "atomic_number": [("atomic_number", e.name.capitalize(), str(e.number)) for e in elements],
        "country_code": [("country_code", _name(c), c.alpha_3) for c in countries],
        "official_name": [
            ("official_name", _name(c), c.official_name)
            for c in countries
            if getattr(c, "official_name", None) and c.official_name != _name(c)
        ],
        "subdivision": sorted(
            ("subdivision", s.name, _name(by_code[s.country_code]))
            for s in pycountry.subdivisions
            if s.country_code in by_code and s.parent_code is None
        ),
    }
    return families


def truth_table(all_facts: dict[str, list[Fact]]) -> dict[str, dict[str, set[str]]]:
    """family -> subject -> every value the data holds for it."""
    table: dict[str, dict[str, set[str]]] = {}
    for family, items in all_facts.items():
        for _, subject, value in items:
            table.setdefault(family, {}).setdefault(subject, set()).add(value)
    return table


TEXT: dict[str, Callable[[str, str], str]] = {
    "element_symbol": lambda s, v: f"The chemical symbol of {s} is {v}.",
    "atomic_number": lambda s, v: f"The atomic number of {s} is {v}.",
    "country_code": lambda s, v: f"The ISO 3166 three-letter code of {s} is {v}.",
    "official_name": lambda s, v: f"The official name of {s} is {v}.",
    "subdivision": lambda s, v: f"{s} is a region of {v}.",
}


def generate(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` claims (n even), half SUPPORTS and half REFUTES, no duplicate claims."""
    if n % 2:
        raise ValueError(f"n must be even for an exactly balanced set, got {n}")
    all_facts = facts()
    table = truth_table(all_facts)
    rng = random.Random(seed)
    pools = {family: rng.sample(items, len(items)) for family, items in all_facts.items()}
    values = {family: sorted({v for _, _, v in items}) for family, items in all_facts.items()}
    records: list[dict[str, Any]] = []
    seen: set[str] = set()
    label_cycle = [SUPPORTS, REFUTES]
    for index, (family, subject, value) in enumerate(_round_robin(pools)):
        if len(records) == n:
            break
        label = label_cycle[index % 2]
        if label == REFUTES:
            value = _false_value(rng, values[family], table[family][subject])
            if value is None:
                continue
        text = TEXT[family](subject, value)
        if text in seen:
            continue
        seen.add(text)
        records.append(
            {
                "id": len(records) + 1,
                "claim": text,
                "label": label,
                "fact": {"family": family, "subject": subject, "value": value},
            }
        )
    counts = [sum(r["label"] == label for r in records) for label in label_cycle]
    if len(records) < n or counts[0] != counts[1]:
        raise ValueError(f"only {len(records)} claims ({counts}) could be made; n={n}")
    rng.shuffle(records)
    for number, record in enumerate(records, 1):
        record["id"] = number
    return records


def _round_robin(pools: dict[str, list[Fact]]) -> Iterator[Fact]:
    iterators = [iter(pools[family]) for family in sorted(pools)]
    while iterators:
        for iterator in list(iterators):
            item = next(iterator, None)
            if item is None:
                iterators.remove(iterator)
            else:
                yield item


def _false_value(rng: random.Random, candidates: list[str], true_values: set[str]) -> str | None:
    for _ in range(20):
        value = rng.choice(candidates)
        if value not in true_values:
            return value
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    from jsonl import write_jsonl

    write_jsonl(args.out, generate(args.n, args.seed))


if __name__ == "__main__":
    main()
