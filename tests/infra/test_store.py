"""The same behaviour from the local store and the S3 store (against a real loopback S3 endpoint)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import boto3
import pytest

from infra.settings import StoreSettings
from infra.store import LocalStore, S3Store, StoreError, atomic_download, open_store, open_uri


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


def test_prefixes_are_paths_s1_never_matches_s10(store):
    """On 98a639e list('web/s1') also returned web/s10/... and delete_prefix('web/s1') deleted it."""
    for key in ("web/s1/a", "web/s1/sub/b", "web/s10/c", "web/s1.bak", "web/s1x"):
        store.put_bytes(key, b"x")
    assert store.list("web/s1") == ["web/s1/a", "web/s1/sub/b"]
    assert store.list("web/s1/") == ["web/s1/a", "web/s1/sub/b"]
    assert store.list("web/s1x") == ["web/s1x"]  # a key is its own path
    assert store.list("web/s") == []
    assert store.list_prefixes("web") == ["s1", "s10"]
    assert store.delete_prefix("web/s1") == 2
    assert store.list("web/") == ["web/s1.bak", "web/s10/c", "web/s1x"]


def test_exists_and_size_decide_by_error_code_not_message(s3_bucket, port):
    """On 98a639e exists() answered False when an error message contained 'no object' (a key named so on
    an unreachable endpoint); a missing key is a 404 code, anything else is an error."""
    endpoint, bucket = s3_bucket
    store = S3Store(f"s3://{bucket}/p", StoreSettings(url="", endpoint_url=endpoint))
    store.put_bytes("notes/no object here.txt", b"12345")
    assert store.exists("notes/no object here.txt") and store.size("notes/no object here.txt") == 5
    assert not store.exists("notes/missing") and store.size("notes/missing") is None
    dead = S3Store(
        f"s3://{bucket}/p", StoreSettings(url="", endpoint_url=f"http://127.0.0.1:{port}", max_attempts=1)
    )
    with pytest.raises(StoreError, match=f"127.0.0.1:{port}"):
        dead.exists("notes/no object here.txt")
    with pytest.raises(StoreError, match=f"127.0.0.1:{port}"):
        dead.size("notes/no object here.txt")


@pytest.fixture
def silent_endpoint():
    """A TCP server on 127.0.0.1 that accepts connections and never answers (a hung S3 endpoint)."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held, stop = [], threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(5)
    for conn in held:
        conn.close()
    server.close()


def test_unresponsive_endpoint_fails_within_the_retry_budget(silent_endpoint, monkeypatch):
    """On 98a639e the timeouts were fixed at 10 s / 60 s (x5 attempts): a hung endpoint stalled a stage for
    minutes. Now the first call fails after max_attempts x read timeout (+ backoff), naming the endpoint."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    settings = StoreSettings(
        url="s3://b/p", endpoint_url=silent_endpoint, max_attempts=2, connect_timeout_s=1, read_timeout_s=1
    )
    store = S3Store(settings.url, settings)
    t0 = time.monotonic()
    with pytest.raises(StoreError) as err:
        store.put_bytes("a/b", b"x")
    elapsed = time.monotonic() - t0
    # 2 attempts x (100-continue wait + response wait) x 1 s, and one short backoff
    assert 3.5 <= elapsed < 8, elapsed
    assert silent_endpoint in str(err.value) and "2 attempts" in str(err.value)
    t0 = time.monotonic()
    with pytest.raises(StoreError, match=silent_endpoint):
        store.exists("a/b")
    assert 1.5 <= time.monotonic() - t0 < 5  # a HEAD waits once per attempt
    defaults = StoreSettings()  # a hung endpoint: ~30 s per GET/HEAD, ~60 s per PUT (was minutes)
    assert (defaults.connect_timeout_s, defaults.read_timeout_s, defaults.max_attempts) == (5, 10, 3)


def _run_child(script: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script)], env=os.environ.copy(), stdout=subprocess.PIPE
    )


def _kill_when(proc: subprocess.Popen, ready, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while not ready():
        assert proc.poll() is None, "the child ended before it was killed"
        assert time.time() < deadline, "the child never reached the point to kill it at"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def test_temp_file_of_a_killed_local_writer_is_removed_when_a_stage_begins(tmp_path):
    """On 98a639e a SIGKILLed writer's `.tmp/` file stayed forever."""
    root = tmp_path / "store"
    proc = _run_child(f"""
        import time
        from infra.store import LocalStore
        def slow_write(tmp):
            tmp.write_bytes(b"half")
            time.sleep(600)
        LocalStore({str(root)!r})._publish("out/x.bin", slow_write)
    """)
    _kill_when(proc, lambda: any((root / ".tmp").glob("*x.bin")))
    store = LocalStore(root)
    live = store._tmp_path(root / "mine.bin")  # this (live) process's temp file must survive
    live.write_bytes(b"in progress")
    store.begin_stage(None)
    assert [p.name for p in (root / ".tmp").iterdir()] == [live.name]
    assert store.list() == []


class _Throttle:
    """A TCP proxy to an upstream endpoint that sends the answers back slowly (a download in flight)."""

    def __init__(self, upstream_port: int, bytes_per_s: int = 256 * 1024):
        import socket
        import threading

        self.upstream, self.rate = upstream_port, bytes_per_s
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(8)
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        import socket
        import threading

        while True:
            try:
                client = self.server.accept()[0]
            except OSError:
                return
            up = socket.create_connection(("127.0.0.1", self.upstream))
            threading.Thread(target=self._pipe, args=(client, up, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(up, client, True), daemon=True).start()

    def _pipe(self, src, dst, slow):
        try:
            while data := src.recv(16384):
                dst.sendall(data)
                if slow:
                    time.sleep(len(data) / self.rate)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def close(self):
        self.server.close()


def test_killed_download_leaves_no_part_file_after_the_next_download(s3_bucket, tmp_path):
    """On 98a639e the `.part` file of a SIGKILLed S3 download stayed next to its destination."""
    endpoint, bucket = s3_bucket
    store = S3Store(f"s3://{bucket}/d", StoreSettings(url="", endpoint_url=endpoint))
    data = os.urandom(3 * 1024 * 1024)
    store.put_bytes("big.bin", data)
    proxy = _Throttle(int(endpoint.rsplit(":", 1)[1]))
    dest = tmp_path / "cache" / "big.bin"
    proc = _run_child(f"""
        from infra.settings import StoreSettings
        from infra.store import S3Store
        S3Store("s3://{bucket}/d", StoreSettings(url="", endpoint_url="{proxy.url}")).download(
            "big.bin", {str(dest)!r})
    """)
    try:
        _kill_when(proc, lambda: any(p.stat().st_size > 0 for p in dest.parent.glob("big.bin.*part*")))
    finally:
        proxy.close()
    assert not dest.exists() and list(dest.parent.glob("big.bin.*part*"))
    assert store.download("big.bin", dest).read_bytes() == data
    assert [p.name for p in dest.parent.iterdir()] == ["big.bin"]


def test_killed_multipart_upload_is_aborted_by_the_next_writer_of_its_prefix(s3_bucket):
    """On 98a639e nothing aborted a killed writer's multipart upload (its parts are billed forever)."""
    endpoint, bucket = s3_bucket
    settings = f'StoreSettings(url="", endpoint_url="{endpoint}", multipart_threshold_mb=5)'
    proc = _run_child(f"""
        import time
        from infra.settings import StoreSettings
        from infra.store import S3Store
        class Slow:
            pos = 0
            def read(self, n=-1):
                if self.pos >= 6 * 2**20:
                    time.sleep(600)
                n = n if n > 0 else 2**20; self.pos += n
                return b"y" * n
        s = S3Store("s3://{bucket}/k", {settings})
        s.put_fileobj("web/s1/v-1/a.bin", Slow())
    """)
    store = S3Store(f"s3://{bucket}/k", StoreSettings(url="", endpoint_url=endpoint))
    _kill_when(proc, lambda: bool(store.incomplete_uploads("web/s1/")))
    store.put_bytes("web/s10/other", b"1")
    cleanup = _run_child(f"""
        from infra.settings import StoreSettings
        from infra.store import S3Store
        s = S3Store("s3://{bucket}/k", {settings})
        print(s.cleanup_orphans("web/s10"), s.cleanup_orphans(""), s.cleanup_orphans("web/s1"))
    """)
    out, _ = cleanup.communicate(timeout=60)
    assert out.split() == [b"0", b"0", b"1"]  # only its own prefix, never a store-wide sweep
    assert store.incomplete_uploads() == [] and store.list() == ["web/s10/other"]


def test_stores_pickle_for_worker_processes(store):
    import pickle

    store.put_bytes("p/x", b"1")
    clone = pickle.loads(pickle.dumps(store))
    assert clone.uri("p/x") == store.uri("p/x") and clone.get_bytes("p/x") == b"1"


def test_two_threads_downloading_one_file_write_separate_temp_files(tmp_path):
    """Before each thread had its own temp name, both wrote `<file>.<host-pid>.part`: the second rename then
    found its temp file already renamed away (FileNotFoundError)."""
    dest = tmp_path / "model.bin"
    both_writing = threading.Barrier(2, timeout=10)
    errors: list[BaseException] = []

    def fetch(tmp: Path, payload: bytes) -> None:
        with open(tmp, "wb") as out:
            out.write(payload[:4])
            both_writing.wait()
            out.write(payload[4:])

    def worker(payload: bytes) -> None:
        try:
            atomic_download(dest, lambda tmp: fetch(tmp, payload))
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(bytes([i]) * 4096,)) for i in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert dest.read_bytes() in (b"\x01" * 4096, b"\x02" * 4096)  # one whole payload, never a mix
    assert [p.name for p in tmp_path.iterdir()] == ["model.bin"]
