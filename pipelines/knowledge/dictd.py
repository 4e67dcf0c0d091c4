"""Reader for dictd databases (`NAME.index` + `NAME.dict.dz`), the format of Debian's dict-* packages.

The index holds one line per headword: `headword<TAB>offset<TAB>length`, offset and length in dictd's
base64 digits. `.dict.dz` is dictzip, a gzip file with random-access chunks, so plain gzip reads it whole.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_B64_VALUE = {c: i for i, c in enumerate(_B64)}


@dataclass(frozen=True)
class DictEntry:
    dictionary: str
    headword: str
    text: str


def decode_dictd_number(digits: str) -> int:
    """dictd's base64 number: most significant digit first, 6 bits per digit."""
    value = 0
    for char in digits:
        value = value * 64 + _B64_VALUE[char]
    return value


def dictd_databases(root: Path) -> list[Path]:
    """The `.index` files of every dictd database under `root` (e.g. an extracted dict-* package)."""
    return sorted(Path(root).rglob("*.index"))


def read_dictd(index_path: Path, min_chars: int = 0) -> Iterator[DictEntry]:
    """Yield the entries of one dictd database in index order, skipping `00database*` metadata entries.

    Several headwords may point at the same definition (aliases); each definition is yielded once.
    """
    index_path = Path(index_path)
    name = index_path.name[: -len(".index")]
    data_path = index_path.with_name(name + ".dict.dz")
    if not data_path.exists():
        data_path = index_path.with_name(name + ".dict")
    opener = gzip.open if data_path.suffix == ".dz" else open
    with opener(data_path, "rb") as fh:
        data = fh.read()
    seen: set[tuple[int, int]] = set()
    for line in index_path.read_text(encoding="utf-8", errors="replace").splitlines():
        parts = line.split("\t")
        if len(parts) < 3 or parts[0].startswith("00database") or parts[0].startswith("00-database"):
            continue
        span = (decode_dictd_number(parts[1]), decode_dictd_number(parts[2]))
        if span in seen:
            continue
        seen.add(span)
        text = clean_dictd_text(data[span[0] : span[0] + span[1]].decode("utf-8", errors="replace"))
        if len(text) >= min_chars:
            yield DictEntry(dictionary=name, headword=parts[0], text=text)


_XREF = re.compile(r"[{}]")  # FOLDOC/jargon cross-reference braces: {Unix} -> Unix
_INDENT = re.compile(r"^[ \t]+", re.MULTILINE)
_BLANKS = re.compile(r"\n{3,}")


def clean_dictd_text(text: str) -> str:
    """Drop cross-reference braces and the definition's indentation, keep paragraphs."""
    text = _XREF.sub("", text)
    text = _INDENT.sub("", text)
    return _BLANKS.sub("\n\n", text).strip()
