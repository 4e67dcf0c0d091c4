"""Is a file a PNG of a drawn figure (not an empty canvas)? Shared by the stage plot tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_drawn_png(path: Path, min_bytes: int = 3_000, max_bytes: int = 400_000) -> tuple[int, int]:
    """Header, size within what Dagster inlines (palette PNGs: a blank canvas is under 1 KB), a figure-sized
    image with more than one colour; returns
    (width, height)."""
    path = Path(path)
    assert path.is_file(), path
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    assert min_bytes <= len(data) <= max_bytes, f"{path}: {len(data)} bytes"
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        width, height = image.size
        pixels = np.asarray(image.convert("L"))
    assert width >= 300 and height >= 200, (width, height)
    assert len(np.unique(pixels)) > 16, f"{path} looks blank"
    return width, height
