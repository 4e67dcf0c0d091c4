"""Invented dictionary facts for the search family's tests."""

from __future__ import annotations

import random

_WORDS = (
    "river stone cloud metal glass paper signal engine circuit market garden winter harbor castle "
    "lantern mirror ladder anchor copper silver basket candle feather hammer violin pepper saddle "
    "tunnel valley meadow orchard compass rocket planet island forest desert canyon glacier"
).split()


def synthetic_facts(n: int = 60, seed: int = 0) -> list[tuple[str, str]]:
    """(term, definition) pairs like the dictionary's: distinct invented terms, definitions of 8-10 words."""
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ra", "tu", "ve", "zo", "ne", "pa", "si"]
    terms = sorted({"".join(rng.sample(syllables, 3)) for _ in range(4 * n)})[:n]
    return [(t, "a device of " + " ".join(rng.sample(_WORDS, rng.randint(7, 9)))) for t in terms]
