"""Fault suite: a web stage's output killed mid-publish on the real (moto) S3 endpoint.

The writer is the real commit of a web_filtered-shaped output (3,000 documents in kept/ and dropped/ shards)
in a child process, SIGKILLed after a seeded random number of uploaded objects; and the real web quality
filter stage, killed the same way. Afterwards the previous version is read exactly or the new one whole,
never a mixture, and a rerun gives the files of an uninterrupted run byte for byte. A second case stops the
S3 endpoint while a multipart upload is in flight.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from infra.committed import commit, committed_shards, read_committed
from infra.settings import StoreSettings
from infra.store import S3Store, StoreError

DOCS, KEPT_SHARDS = 3000, 12
# kill points: before any upload, three seeded random points among the files, just after the pointer
KILL_POINTS = ["first", 0, 1, 2, "pointer"]


def _docs_dir(root: Path, tag: str) -> Path:
    """A web_filtered-shaped output: kept/ shards of 250 docs and two dropped/<filter>/ shards."""
    for i in range(KEPT_SHARDS):
        _shard(root / f"kept/{i:05d}.jsonl.gz", [f"{tag}-{i}-{j}" for j in range(DOCS // KEPT_SHARDS)])
    for name in ("c4_quality", "gopher_quality"):
        _shard(root / f"dropped/{name}/00000.jsonl.gz", [f"{tag}-dropped-{name}-{j}" for j in range(40)])
    return root


def _shard(path: Path, ids: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps({"id": i, "text": f"document {i} " + "lorem ipsum " * 40}) + "\n" for i in ids)
    path.write_bytes(gzip.compress(lines.encode(), mtime=0))


def _store(endpoint: str, bucket: str) -> S3Store:
    url = f"s3://{bucket}/crucible"
    return S3Store(url, StoreSettings(url=url, endpoint_url=endpoint, max_attempts=2, read_timeout_s=5))


def _files(store, prefix: str) -> dict[str, bytes]:
    out = read_committed(store, prefix)
    return {name: store.get_bytes(out.key(name)) for name in out.names()}


def _kept_ids(store, prefix: str) -> list[str]:
    ids = []
    for key in committed_shards(store, f"{prefix}/kept/", ".jsonl.gz"):
        ids += [json.loads(line)["id"] for line in gzip.decompress(store.get_bytes(key)).splitlines()]
    return ids


_CHILD = """
import sys
from pathlib import Path
from infra.settings import StoreSettings
from infra.store import S3Store

url, endpoint = sys.argv[1], sys.argv[2]
store = S3Store(url, StoreSettings(url=url, endpoint_url=endpoint))
for name in ("put_file", "put_bytes"):  # report each object once it is uploaded (the parent kills on a count)
    def reporting(key, data, _real=getattr(store, name)):
        out = _real(key, data)
        print("put", key, flush=True)
        sys.stdin.readline()  # the parent's go-ahead: it kills here instead once it has seen enough
        return out
    setattr(store, name, reporting)
"""


def _run_and_kill(args: list[str], body: str, kill_after: int, timeout: float = 120) -> tuple[int, int]:
    """Run a child that reports uploads; SIGKILL it after `kill_after` uploads. (uploads seen, exit code)
    The child waits for a go-ahead after each upload, so the kill lands right after the `kill_after`-th one
    however the two processes are scheduled (a busy machine once let the child finish first)."""
    script = textwrap.dedent(_CHILD) + textwrap.dedent(body)
    proc = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    seen, deadline = 0, time.time() + timeout
    while seen < kill_after and time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break  # the child finished (or died) before the kill point
        if line.startswith("put "):
            seen += 1
            if seen < kill_after:
                proc.stdin.write("go\n")
                proc.stdin.flush()
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    proc.stdout.close()
    proc.stdin.close()
    return seen, proc.returncode


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("outputs")
    return _docs_dir(root / "old", "old"), _docs_dir(root / "new", "new")


@pytest.mark.parametrize("point", KILL_POINTS)
def test_kill_during_commit_leaves_old_or_whole_new_and_rerun_is_identical(s3_bucket, outputs, point):
    endpoint, bucket = s3_bucket
    old_dir, new_dir = outputs
    store = _store(endpoint, bucket)
    reference = commit(store, "reference/web_filtered", new_dir)  # an uninterrupted run
    expected_new = _files(store, "reference/web_filtered")
    prefix = f"web/filtered/s-{point}"
    old = commit(store, prefix, old_dir)
    expected_old = _files(store, prefix)
    n_objects = len(expected_new) + 1  # the files, then the pointer
    random_point = isinstance(point, int) and random.Random(point).randint(1, n_objects - 1)
    kill_after = {"first": 0, "pointer": n_objects}.get(point, random_point)
    seen, code = _run_and_kill(
        [store.uri(), endpoint, prefix, str(new_dir)],
        "from infra.committed import commit\ncommit(store, sys.argv[3], Path(sys.argv[4]))\n",
        kill_after,
    )
    # after the pointer only the old version's deletion is left: the writer may finish before the kill
    assert code == -signal.SIGKILL or point == "pointer", "the writer must be killed, not finish"

    after = read_committed(store, prefix)  # verifies every listed file: never a partial version
    assert after.version in (old.version, reference.version), (point, seen)
    if kill_after < n_objects - 1:  # killed with files still to upload: the pointer cannot have moved
        assert after.version == old.version, (point, seen)
    if point == "pointer":
        assert after.version == reference.version
    if after.version == old.version:
        assert _files(store, prefix) == expected_old and len(_kept_ids(store, prefix)) == DOCS
        assert all(i.startswith("old-") for i in _kept_ids(store, prefix))
    else:
        assert seen >= n_objects - 1 and _files(store, prefix) == expected_new

    rerun = commit(_store(endpoint, bucket), prefix, new_dir)
    assert rerun.version == reference.version and _files(store, prefix) == expected_new
    ids = _kept_ids(store, prefix)
    assert len(ids) == DOCS and all(i.startswith("new-") for i in ids)
    assert _store(endpoint, bucket).incomplete_uploads(prefix + "/") == []


def test_kill_during_the_real_web_filter_stage(s3_bucket, outputs, tmp_path):
    """The web quality filter stage itself (datatrove, then commit), killed after its first uploaded object."""
    from pipelines.web.extract import ExtractConfig, filter_documents

    endpoint, bucket = s3_bucket
    store = _store(endpoint, bucket)
    docs = tmp_path / "extract"
    _shard(docs / "kept/00000.jsonl.gz", [f"doc-{j}" for j in range(300)])
    commit(store, "web/extract/s1", docs)
    config = ExtractConfig(tasks=1)
    reference = filter_documents(config, store, "s1", "web/extract/s1", "reference/filtered")
    expected = _files(store, "reference/filtered")
    previous = commit(store, "web/filtered/s1", outputs[0])
    seen, code = _run_and_kill(
        [store.uri(), endpoint],
        """
        from pipelines.web.extract import ExtractConfig, filter_documents
        filter_documents(ExtractConfig(tasks=1), store, "s1", "web/extract/s1", "web/filtered/s1")
        """,
        kill_after=1,
    )
    assert (seen, code) == (1, -signal.SIGKILL)
    assert read_committed(store, "web/filtered/s1").version == previous.version
    assert len(_kept_ids(store, "web/filtered/s1")) == DOCS
    rerun = filter_documents(config, _store(endpoint, bucket), "s1", "web/extract/s1", "web/filtered/s1")
    assert rerun.data_version == reference.data_version and _files(store, "web/filtered/s1") == expected


class _SlowUploads:
    """A TCP proxy that forwards request bodies to the S3 endpoint at a limited rate (an upload in flight)."""

    def __init__(self, upstream_port: int, bytes_per_s: int = 8 * 1024 * 1024):
        self.upstream, self.rate, self.conns = upstream_port, bytes_per_s, []
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client = self.server.accept()[0]
                up = socket.create_connection(("127.0.0.1", self.upstream))
            except OSError:
                return
            self.conns += [client, up]
            threading.Thread(target=self._pipe, args=(client, up, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(up, client, False), daemon=True).start()

    def _pipe(self, src, dst, slow):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
                if slow:
                    time.sleep(len(data) / self.rate)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        self.server.close()
        for s in self.conns:
            try:
                s.close()
            except OSError:
                pass


def test_endpoint_stopped_mid_multipart_upload_fails_clearly_and_keeps_the_pointer(s3_bucket, tmp_path):
    """A dedicated S3 endpoint is stopped while a multipart upload of a new version is in flight."""
    from moto.server import ThreadedMotoServer

    _, bucket = s3_bucket  # moto keeps its buckets per process: a second server sees the same state
    port = free_port_here()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    proxy = _SlowUploads(port)
    store = _store(proxy.url, bucket)
    store.transfer.multipart_threshold = store.transfer.multipart_chunksize = 5 * 1024 * 1024
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "kept.bin").write_bytes(b"old" * 1000)
    old = commit(store, "web/filtered/big", tmp_path / "v1")
    (tmp_path / "v2").mkdir()
    (tmp_path / "v2" / "kept.bin").write_bytes(os.urandom(24 * 1024 * 1024))
    errors: list[BaseException] = []

    def write():
        try:
            commit(store, "web/filtered/big", tmp_path / "v2")
        except BaseException as exc:  # noqa: BLE001  (the assertion below names it)
            errors.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    watcher = _store(proxy.url, bucket)
    deadline = time.time() + 60
    while not watcher.incomplete_uploads("web/filtered/big/") and time.time() < deadline:
        time.sleep(0.05)
    assert watcher.incomplete_uploads("web/filtered/big/"), "the multipart upload never started"
    server.stop()
    proxy.close()
    writer.join(120)
    assert not writer.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], StoreError), errors
    assert proxy.url in str(errors[0])  # the error names the endpoint that failed

    port = free_port_here()
    restarted = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    restarted.start()
    try:
        again = _store(f"http://127.0.0.1:{port}", bucket)
        out = read_committed(again, "web/filtered/big")
        assert out.version == old.version and again.get_bytes(out.key("kept.bin")) == b"old" * 1000
        # the half-sent version is no object: only an incomplete upload, which the next writer aborts
        assert again.list("web/filtered/big/") == ["web/filtered/big/_committed.json", out.key("kept.bin")]
        assert again.abort_incomplete_uploads("web/filtered/big/") == 1
    finally:
        restarted.stop()


def test_rerun_aborts_the_multipart_upload_a_killed_writer_left(s3_bucket, tmp_path):
    """On 98a639e a writer SIGKILLed mid multipart upload left the upload open forever (its parts are stored
    and billed); the next commit of that prefix, in a new process, aborts it."""
    endpoint, bucket = s3_bucket
    proxy = _SlowUploads(int(endpoint.rsplit(":", 1)[1]), bytes_per_s=2 * 1024 * 1024)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "big.bin").write_bytes(os.urandom(12 * 1024 * 1024))
    script = """
        import sys
        from pathlib import Path
        from infra.committed import commit
        from infra.settings import StoreSettings
        from infra.store import S3Store
        url, endpoint = sys.argv[1], sys.argv[2]
        store = S3Store(url, StoreSettings(url=url, endpoint_url=endpoint, multipart_threshold_mb=5))
        print(commit(store, "web/filtered/mp", Path(sys.argv[3])).version)
    """
    store = _store(endpoint, bucket)
    args = [store.uri(), proxy.url, str(tmp_path / "out")]
    writer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *args], env=os.environ.copy())
    deadline = time.time() + 60
    while not store.incomplete_uploads("web/filtered/mp/") and time.time() < deadline:
        time.sleep(0.05)
    writer.send_signal(signal.SIGKILL)
    writer.wait(30)
    proxy.close()
    assert len(store.incomplete_uploads("web/filtered/mp/")) == 1
    args[1] = endpoint
    rerun = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        env=os.environ.copy(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert read_committed(store, "web/filtered/mp").version == rerun.stdout.split()[-1]
    assert store.incomplete_uploads("web/filtered/mp/") == []


def free_port_here() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
