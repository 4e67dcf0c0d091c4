"""SIGKILL the dedup stage at seeded random store operations, then rerun: the committed outputs and the index
equal an uninterrupted run's byte for byte, and after the kill nothing partial is readable (the previous
version, or the new one whole).

A runner process imports the stage once and forks one child per kill point; the child counts its writes and
deletes to the store and SIGKILLs itself just before operation k (so every point between two operations,
including the index log append and the output pointer switch, can be hit). Two scenarios on the planted-
duplicate corpus: a rerun of 2024-10 after its input changed (the previous version must stay readable), and
the first run of 2024-05 against it (a new sequence number); on the local store and the moto S3 server."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "pipelines"))  # the planted-duplicate corpus
from conftest_dedup import snapshot_a, snapshot_b, write_shards  # noqa: E402

from infra.committed import CommitError, read_committed  # noqa: E402
from infra.settings import StoreSettings, load_profile, validate_stage  # noqa: E402
from infra.store import LocalStore, S3Store  # noqa: E402
from pipelines.dedup import DedupConfig, dedup_partition  # noqa: E402
from pipelines.dedup.index import list_entries, verify_parts  # noqa: E402
from training.data import document_keys  # noqa: E402

A, B = "2024-10", "2024-05"
SEED = 18
KILLS_PER_SCENARIO = {"local": 2, "s3": 1}  # random points per scenario, plus the two commit points

_RUNNER = textwrap.dedent(
    """
    import gzip, json, os, shutil, signal, sys, tempfile
    from pathlib import Path
    from infra.settings import StoreSettings, load_profile, validate_stage
    from infra.store import LocalStore, S3Store
    from pipelines.dedup import DedupConfig, dedup_partition

    def killing(base):
        class KillingStore(base):
            # SIGKILL just before write/delete number `kill_at` (0: never); counts them either way
            ops, kill_at = 0, 0

            def _op(self):
                self.ops += 1
                if self.ops == self.kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)

            def put_file(self, key, path):
                self._op()
                return super().put_file(key, path)

            def put_bytes(self, key, data):
                self._op()
                return super().put_bytes(key, data)

            def put_bytes_if_absent(self, key, data):
                self._op()
                return super().put_bytes_if_absent(key, data)

            def delete(self, key):
                self._op()
                return super().delete(key)

        return KillingStore

    def open_store(root, endpoint, kill_at):
        if root.startswith("s3://"):
            store = killing(S3Store)(root, StoreSettings(url=root, endpoint_url=endpoint))
        else:
            store = killing(LocalStore)(root)
        store.kill_at = kill_at
        return store

    cfg = validate_stage(load_profile("micro"), "dedup_web", DedupConfig)
    # warm up once (lazy imports, matplotlib's font cache) so each forked child starts warm
    warm = Path(tempfile.mkdtemp(prefix="dedup-warm-"))
    shard = warm / "store/web/filtered/warm/kept/00000.jsonl.gz"
    shard.parent.mkdir(parents=True)
    shard.write_bytes(gzip.compress(json.dumps({"id": "d", "text": "a b c d e f g"}).encode() + b"\\n"))
    dedup_partition(cfg, LocalStore(warm / "store"), "warm", scratch=warm)
    shutil.rmtree(warm)
    print("ready", flush=True)
    for line in sys.stdin:
        root, endpoint, snapshot, scratch, kill_at = json.loads(line)
        pid = os.fork()
        if pid == 0:  # the child builds its own store (and S3 client) after the fork
            store = open_store(root, endpoint, kill_at)
            dedup_partition(cfg, store, snapshot, scratch=Path(scratch))
            Path(scratch, "ops").write_text(str(store.ops))
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        died = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
        print(json.dumps({"signal": died, "exit": os.WEXITSTATUS(status) if not died else None}), flush=True)
    """
)


class CountingStore(LocalStore):
    """Counts writes and deletes the way the runner's KillingStore does (the reference runs' op totals)."""

    ops = 0

    def put_file(self, key, path):
        self.ops += 1
        return super().put_file(key, path)

    def put_bytes(self, key, data):
        self.ops += 1
        return super().put_bytes(key, data)

    def put_bytes_if_absent(self, key, data):
        self.ops += 1
        return super().put_bytes_if_absent(key, data)

    def delete(self, key):
        self.ops += 1
        return super().delete(key)


def _cfg() -> DedupConfig:
    return validate_stage(load_profile("micro"), "dedup_web", DedupConfig)


def _committed_bytes(store, snapshot: str) -> dict[str, bytes]:
    """The committed output of a snapshot (sizes checked), every file's bytes by name, and its version."""
    out = read_committed(store, f"dedup/web/{snapshot}")
    return {name: store.get_bytes(out.key(name)) for name in out.names()} | {
        "<version>": out.version.encode()
    }


def _index_state(store) -> tuple[list[bytes], dict[str, bytes]]:
    """The index log records and the bytes of every part the current entries list."""
    log = [store.get_bytes(k) for k in store.list("dedup/web/index/_log/")]
    entries = list_entries(store, "dedup/web/index")
    verify_parts(store, entries, "dedup/web/index")
    return log, {key: store.get_bytes(key) for e in entries for key in e.parts}


class Runner:
    def __init__(self, tmp_path: Path):
        script = tmp_path / "runner.py"
        script.write_text(_RUNNER)
        self.proc = subprocess.Popen(
            [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            start_new_session=True,
        )  # fmt: skip
        assert self.proc.stdout.readline().strip() == "ready", "the runner failed to start"

    def run(self, store, endpoint: str, snapshot: str, scratch: Path, kill_at: int = 0) -> dict:
        scratch.mkdir(parents=True, exist_ok=True)
        root = str(store.root) if isinstance(store, LocalStore) else store.uri().rstrip("/")
        self.proc.stdin.write(json.dumps([root, endpoint, snapshot, str(scratch), kill_at]) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, "the runner process died"
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
        # a killed child's own children (the stage's workers) outlive it, orphaned; they keep the group
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)


@pytest.fixture
def runner(kind, request, tmp_path):
    if kind == "s3":
        request.getfixturevalue("s3_bucket")  # the S3 endpoint's credentials are in the runner's environment
    r = Runner(tmp_path)
    yield r
    r.close()


def _seeded(kind: str, request, tmp_path: Path, name: str, base: Path):
    """A store of `kind` holding the files of the local store directory `base`."""
    if kind == "local":
        shutil.copytree(base, tmp_path / name, dirs_exist_ok=True)
        return LocalStore(tmp_path / name), ""
    endpoint, bucket = request.getfixturevalue("s3_bucket")
    url = f"s3://{bucket}/{name}"
    store = S3Store(url, StoreSettings(url=url, endpoint_url=endpoint))
    for path in sorted(p for p in base.rglob("*") if p.is_file() and ".tmp" not in p.parts):
        store.put_file(path.relative_to(base).as_posix(), path)
    return store, endpoint


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_sigkill_at_random_points_then_rerun_equals_uninterrupted_run(kind, request, tmp_path, runner):
    a_docs = snapshot_a()
    a_changed = [d for d in a_docs if d["id"] != "solo-0"]
    b_docs = snapshot_b(a_docs)
    cfg = _cfg()

    # the uninterrupted reference: 2024-10, its changed input, then 2024-05
    clean = CountingStore(tmp_path / "clean")
    write_shards(clean.root, f"web/filtered/{A}/kept", a_docs, shards=4)
    write_shards(clean.root, f"web/filtered/{B}/kept", b_docs, shards=2)
    dedup_partition(cfg, clean, A, scratch=tmp_path)
    a_old = _committed_bytes(clean, A)
    rerun_base = tmp_path / "rerun_base"  # 2024-10 committed, then its input changed
    shutil.copytree(clean.root, rerun_base)
    write_shards(clean.root, f"web/filtered/{A}/kept", a_changed, shards=4)
    write_shards(rerun_base, f"web/filtered/{A}/kept", a_changed, shards=4)
    clean.ops = 0
    dedup_partition(cfg, clean, A, scratch=tmp_path)
    rerun_ops, a_new, index_after_a = clean.ops, _committed_bytes(clean, A), _index_state(clean)
    assert a_new != a_old
    new_base = tmp_path / "new_base"  # 2024-10 at its new version, 2024-05 never processed
    shutil.copytree(clean.root, new_base)
    clean.ops = 0
    dedup_partition(cfg, clean, B, scratch=tmp_path)
    new_ops, b_ref, index_after_b = clean.ops, _committed_bytes(clean, B), _index_state(clean)

    rng = random.Random(SEED)
    cases = 0
    for base, snapshot, total, before, after, index_ref in (
        (rerun_base, A, rerun_ops, a_old, a_new, index_after_a),
        (new_base, B, new_ops, None, b_ref, index_after_b),
    ):
        # seeded random points, plus the two commit points (index log append, output pointer switch)
        points = sorted(set(rng.sample(range(1, total - 1), KILLS_PER_SCENARIO[kind])) | {total - 1, total})
        for k in points:
            store, endpoint = _seeded(kind, request, tmp_path, f"killed-{snapshot}-{k}", base)
            outcome = runner.run(store, endpoint, snapshot, tmp_path / f"scratch-{snapshot}-{k}", kill_at=k)
            assert outcome["signal"] == signal.SIGKILL, (snapshot, k, outcome)

            # after the kill: the previous version or the new one, whole; never a mix, never a damaged one
            try:
                seen = _committed_bytes(store, snapshot)
            except CommitError:
                seen = None
            assert seen in (before, after), (snapshot, k)
            if seen is not None:  # and a corpus reader gets exactly that version's files
                keys = document_keys(store, f"dedup/web/{snapshot}/kept/")
                assert keys == read_committed(store, f"dedup/web/{snapshot}").keys(under="kept")
            _index_state(store)  # every listed index part exists with its size

            dedup_partition(cfg, store, snapshot, scratch=tmp_path)
            assert _committed_bytes(store, snapshot) == after, (snapshot, k)
            assert _index_state(store) == index_ref, (snapshot, k)
            cases += 1
    assert cases >= 2 * (KILLS_PER_SCENARIO[kind] + 2)
