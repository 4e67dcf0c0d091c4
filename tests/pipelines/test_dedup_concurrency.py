"""Two dedup runs of one kind at the same time: the index commit is a compare-and-swap
(`ObjectStore.put_bytes_if_absent`), so they never take the same sequence number and the later one is
deduplicated against the earlier one. Real moto S3 server and the local store, real threads."""

from __future__ import annotations

import threading

import pytest

from infra.settings import StoreSettings
from infra.store import LocalStore, S3Store


def _stores(kind: str, tmp_path, request):
    if kind == "local":
        return LocalStore(tmp_path / "store")
    endpoint, bucket = request.getfixturevalue("s3_bucket")
    url = f"s3://{bucket}/crucible"
    return S3Store(url, StoreSettings(url=url, endpoint_url=endpoint))


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_put_bytes_if_absent_lets_exactly_one_of_many_writers_create_a_key(kind, tmp_path, request):
    store = _stores(kind, tmp_path, request)
    assert store.put_bytes_if_absent("log/0000.json", b"first") is True
    assert store.put_bytes_if_absent("log/0000.json", b"second") is False
    assert store.get_bytes("log/0000.json") == b"first"

    # 8 threads race for one fresh key: one wins, the object holds the winner's bytes whole
    results: dict[int, bool] = {}
    barrier = threading.Barrier(8)

    def race(i: int) -> None:
        writer = _stores(kind, tmp_path, request) if kind == "s3" else store  # one boto3 client per thread
        barrier.wait()
        results[i] = writer.put_bytes_if_absent("log/0001.json", f"writer-{i}".encode() * 1000)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, ok in results.items() if ok]
    assert len(results) == 8 and len(winners) == 1
    assert store.get_bytes("log/0001.json") == f"writer-{winners[0]}".encode() * 1000
    assert store.list("log/") == ["log/0000.json", "log/0001.json"]  # no temp files left behind
