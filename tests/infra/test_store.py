"""The same behaviour from the local store and the S3 store (against a real loopback S3 endpoint)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import boto3
import pytest

from infra.settings import StoreSettings
from infra.store import LocalStore, S3Store, StoreError, open_store, open_uri


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    endpoint, bucket = request.getfixturevalue("s3_bucket")
    settings = StoreSettings(url=f"s3://{bucket}/prefix", endpoint_url=endpoint, multipart_threshold_mb=5)
    return S3Store(settings.url, settings)


def test_roundtrip_list_and_delete(store, tmp_path):
    store.put_bytes("a/b/one.txt", b"1")
    store.put_json("a/two.json", {"x": 2})
    src = tmp_path / "three.bin"
    src.write_bytes(os.urandom(1000))
    store.put_file("c/three.bin", src)
    assert store.get_bytes("a/b/one.txt") == b"1"
    assert store.get_json("a/two.json") == {"x": 2}
    assert store.list() == ["a/b/one.txt", "a/two.json", "c/three.bin"]
    assert store.list("a/") == ["a/b/one.txt", "a/two.json"]
    assert store.list_prefixes("") == ["a", "c"]
    assert store.list_prefixes("a") == ["b"]
    with store.local_copy("c/three.bin") as path:
        assert path.read_bytes() == src.read_bytes()
    assert store.exists("c/three.bin") and not store.exists("c/nope")
    assert store.delete_prefix("a/") == 2
    assert store.list() == ["c/three.bin"]


def test_missing_object_and_bad_key_errors_are_actionable(store):
    with pytest.raises(StoreError, match="no object"):
        store.get_bytes("missing/key")
    with pytest.raises(StoreError, match="invalid object key"):
        store.put_bytes("../escape", b"x")


def test_writer_publishes_only_on_success(store):
    with store.writer("out/ok.txt") as path:
        path.write_text("complete")
    assert store.get_bytes("out/ok.txt") == b"complete"
    with pytest.raises(RuntimeError):
        with store.writer("out/failed.txt") as path:
            path.write_text("half")
            raise RuntimeError("crash mid-write")
    assert not store.exists("out/failed.txt")


def test_multipart_upload_roundtrip(s3_bucket, tmp_path):
    endpoint, bucket = s3_bucket
    store = S3Store(
        f"s3://{bucket}/mp", StoreSettings(url="", endpoint_url=endpoint, multipart_threshold_mb=5)
    )
    data = os.urandom(12 * 1024 * 1024)
    (tmp_path / "big").write_bytes(data)
    store.put_file("big.bin", tmp_path / "big")
    head = store.client.head_object(Bucket=bucket, Key="mp/big.bin")
    assert "-" in head["ETag"], "a multipart upload's ETag carries the part count"
    assert store.get_bytes("big.bin") == data


class _FailingReader:
    """A file object that dies after `limit` bytes, like a writer process crashing mid-upload."""

    def __init__(self, size: int, limit: int):
        self.size, self.limit, self.pos = size, limit, 0

    def read(self, n=-1):
        if self.pos >= self.limit:
            raise OSError("simulated crash")
        n = self.size - self.pos if n < 0 else min(n, self.size - self.pos)
        self.pos += n
        return b"x" * n


def test_failed_multipart_upload_leaves_no_object(s3_bucket):
    endpoint, bucket = s3_bucket
    store = S3Store(
        f"s3://{bucket}/p", StoreSettings(url="", endpoint_url=endpoint, multipart_threshold_mb=5)
    )
    with pytest.raises((StoreError, OSError)):
        store.put_fileobj("final.bin", _FailingReader(20 * 1024 * 1024, 11 * 1024 * 1024))
    assert not store.exists("final.bin")
    assert store.list() == []


def test_killed_multipart_upload_leaves_no_object(s3_bucket, tmp_path):
    """SIGKILL a process in the middle of a multipart upload: nothing appears under the final key."""
    endpoint, bucket = s3_bucket
    script = textwrap.dedent(f"""
        import time
        from infra.settings import StoreSettings
        from infra.store import S3Store
        class Slow:
            def __init__(self): self.pos = 0
            def read(self, n=-1):
                if self.pos >= 30 * 2**20: return b""
                time.sleep(0.3)
                n = min(n if n > 0 else 2**20, 30 * 2**20 - self.pos); self.pos += n
                return b"y" * n
        s = S3Store("s3://{bucket}/k", StoreSettings(url="", endpoint_url="{endpoint}", multipart_threshold_mb=5))
        s.put_fileobj("final.bin", Slow())
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], env=os.environ.copy())
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    deadline = time.time() + 60
    started = False
    while time.time() < deadline and not started:
        ups = client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
        started = any(u["Key"] == "k/final.bin" for u in ups) and bool(
            client.list_parts(Bucket=bucket, Key="k/final.bin", UploadId=ups[0]["UploadId"]).get("Parts")
        )
        time.sleep(0.2)
    assert started, "the upload should have sent at least one part"
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    store = S3Store(f"s3://{bucket}/k", StoreSettings(url="", endpoint_url=endpoint))
    assert not store.exists("final.bin")
    assert len(store.incomplete_uploads()) == 1
    assert store.abort_incomplete_uploads() == 1
    assert store.incomplete_uploads() == []


def test_missing_bucket_error_names_the_fix(s3_endpoint):
    store = S3Store("s3://no-such-bucket/x", StoreSettings(url="", endpoint_url=s3_endpoint, max_attempts=1))
    with pytest.raises(StoreError, match="does not exist"):
        store.put_bytes("a", b"b")


def test_open_store_and_open_uri(tmp_path, s3_bucket):
    local = open_store(StoreSettings(url="store"), tmp_path)
    assert isinstance(local, LocalStore) and local.root == (tmp_path / "store").resolve()
    endpoint, bucket = s3_bucket
    remote = open_uri(f"s3://{bucket}/warcs", StoreSettings(url="", endpoint_url=endpoint))
    assert isinstance(remote, S3Store) and remote.uri("x") == f"s3://{bucket}/warcs/x"
    with pytest.raises(StoreError, match="no such directory"):
        open_uri(str(tmp_path / "nope"))


def test_directories_publish_with_a_completion_marker(store, tmp_path):
    src = tmp_path / "ckpt"
    (src / "sub").mkdir(parents=True)
    (src / "config.json").write_text("{}")
    (src / "sub" / "weights.bin").write_bytes(b"w" * 100)
    store.put_dir("checkpoints/base", src)
    assert store.list("checkpoints/base/") == [
        "checkpoints/base/_COMPLETE",
        "checkpoints/base/config.json",
        "checkpoints/base/sub/weights.bin",
    ]
    out = store.get_dir("checkpoints/base", tmp_path / "copy")
    assert (out / "sub" / "weights.bin").read_bytes() == b"w" * 100
    store.delete("checkpoints/base/_COMPLETE")
    with pytest.raises(StoreError, match="incomplete"):
        store.get_dir("checkpoints/base", tmp_path / "again")


def test_stores_pickle_for_worker_processes(store):
    import pickle

    store.put_bytes("p/x", b"1")
    clone = pickle.loads(pickle.dumps(store))
    assert clone.uri("p/x") == store.uri("p/x") and clone.get_bytes("p/x") == b"1"
