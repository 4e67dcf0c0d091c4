"""Partition keys (crawl and code snapshots) become path segments of store keys, so they are checked before
Dagster records them and again where a stage turns one into a store prefix: a key with `/`, `.`, `..` or an
empty name would read, overwrite or delete another partition's output."""

from __future__ import annotations

import re
from collections.abc import Iterable

PARTITION_KEY_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
_PARTITION_KEY = re.compile(PARTITION_KEY_PATTERN)


class InvalidPartitionKey(ValueError):
    """A partition key that is not a single safe path segment; the message names the allowed pattern."""


def validate_partition_key(key: str) -> str:
    """`key` unchanged if it is one path segment matching PARTITION_KEY_PATTERN without `..`; else raises."""
    if not isinstance(key, str) or not _PARTITION_KEY.fullmatch(key) or ".." in key:
        raise InvalidPartitionKey(
            f"invalid partition key {key!r}: a partition key names a store directory, so it must match "
            f"{PARTITION_KEY_PATTERN} (a letter or digit, then up to 63 letters, digits, '.', '_' or '-') "
            "and must not contain '..'"
        )
    return key


def partition_prefix(base: str, key: str) -> str:
    """The store prefix `<base>/<key>` of one partition's output, after checking the key."""
    return f"{base.rstrip('/')}/{validate_partition_key(key)}"


def validate_partition_keys(keys: Iterable[str | None]) -> None:
    """Check every key of a run (None = an unpartitioned asset) before any of them is processed."""
    for key in keys:
        if key is not None:
            validate_partition_key(key)
