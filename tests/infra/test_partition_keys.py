"""Partition keys are path segments of store keys: only one safe segment is accepted, and no store key, however
it was built, can leave the store's root or prefix."""

from __future__ import annotations

import pytest

from infra.settings import StoreSettings
from infra.store import LocalStore, S3Store, StoreError

HOSTILE_PARTITION_KEYS = ["a/b", "..", ".", "", "-x", "x/../y", "x" * 65, "a..b", ".hidden", "a\\b", "a\x00b",
                          "a b", "snap\n", "é"]  # fmt: skip
VALID_PARTITION_KEYS = ["cc-2026-40", "local-docs-0001", "code-0001", "a", "A.b_c-9", "x" * 64]
# keys that name something other than one object under the store's root / prefix
ESCAPING_STORE_KEYS = ["", "/etc/passwd", "a//b", "a/", "./a", "a/./b", "..", "../x", "a/../../x", "a\\..\\b",
                       "a\x00b", "web/warc/x/.."]  # fmt: skip


@pytest.mark.parametrize("key", HOSTILE_PARTITION_KEYS)
def test_hostile_partition_keys_are_refused_naming_the_pattern(key):
    from infra.partition_keys import (
        PARTITION_KEY_PATTERN,
        InvalidPartitionKey,
        partition_prefix,
        validate_partition_key,
    )

    with pytest.raises(InvalidPartitionKey) as err:
        validate_partition_key(key)
    assert PARTITION_KEY_PATTERN in str(err.value) and repr(key) in str(err.value)
    with pytest.raises(InvalidPartitionKey):
        partition_prefix("web/warc", key)  # where stages turn a partition into a store prefix


def test_valid_partition_keys_round_trip_through_the_store(tmp_path):
    from infra.partition_keys import partition_prefix, validate_partition_key

    store = LocalStore(tmp_path / "store")
    for key in VALID_PARTITION_KEYS:
        assert validate_partition_key(key) == key
        prefix = partition_prefix("web/warc/", key)
        assert prefix == f"web/warc/{key}"
        store.put_bytes(f"{prefix}/part-0.warc.gz", key.encode())
    assert store.list_prefixes("web/warc") == sorted(VALID_PARTITION_KEYS)
    assert [store.get_bytes(f"web/warc/{k}/part-0.warc.gz").decode() for k in VALID_PARTITION_KEYS] == (
        VALID_PARTITION_KEYS
    )


@pytest.mark.parametrize("key", ESCAPING_STORE_KEYS)
def test_local_store_refuses_keys_that_escape_or_alias(tmp_path, key):
    root = tmp_path / "store"
    store = LocalStore(root)
    store.put_bytes("web/warc/x/part-0", b"mine")
    for op in (
        lambda: store.put_bytes(key, b"evil"),
        lambda: store.get_bytes(key),
        lambda: store.delete(key),
    ):
        with pytest.raises(StoreError, match="invalid object key"):
            op()
    assert store.get_bytes("web/warc/x/part-0") == b"mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"], "nothing written beside the store root"


def test_s3_store_refuses_keys_that_escape_its_prefix(s3_bucket):
    endpoint, bucket = s3_bucket
    store = S3Store(
        f"s3://{bucket}/tenant", StoreSettings(url=f"s3://{bucket}/tenant", endpoint_url=endpoint)
    )
    for key in ESCAPING_STORE_KEYS:
        with pytest.raises(StoreError, match="invalid object key"):
            store.put_bytes(key, b"evil")
    store.put_bytes("web/warc/x/part-0", b"mine")
    assert store.list("") == ["web/warc/x/part-0"]
    keys = [o["Key"] for o in store.client.list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert keys == ["tenant/web/warc/x/part-0"]
