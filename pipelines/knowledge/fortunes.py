"""Reader for BSD fortune files (Debian `fortunes`, `fortunes-min`): entries separated by lines of `%`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Fortune:
    collection: str
    index: int
    text: str


def fortune_files(root: Path) -> list[Path]:
    """Fortune text files under `root`: those with a `.dat` index next to them (skips .u8 / .dat / docs)."""
    return sorted(p.with_suffix("") for p in Path(root).rglob("*.dat") if p.with_suffix("").is_file())


def read_fortunes(path: Path, min_chars: int = 1) -> Iterator[Fortune]:
    """Yield the fortunes of one file, in order."""
    path = Path(path)
    entry: list[str] = []
    index = 0
    for line in path.read_text(encoding="latin-1").splitlines() + ["%"]:
        if line.strip() == "%":
            text = "\n".join(entry).strip()
            entry = []
            if len(text) >= min_chars:
                yield Fortune(collection=path.name, index=index, text=text)
            index += 1
        else:
            entry.append(line)
