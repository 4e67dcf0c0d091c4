"""Committed outputs on the local store and the real S3 endpoint: a reader sees a whole version or an error."""

from __future__ import annotations

import pytest

from infra.committed import (
    CommitError,
    Producer,
    fetch_committed,
    fetch_file,
    is_committed,
    read_committed,
)
from infra.committed import commit as commit_output
from infra.settings import StoreSettings
from infra.store import LocalStore, S3Store


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    endpoint, bucket = request.getfixturevalue("s3_bucket")
    return S3Store(f"s3://{bucket}/p", StoreSettings(url=f"s3://{bucket}/p", endpoint_url=endpoint))


def _tree(root, files: dict[str, bytes]):
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def test_commit_then_read_lists_exact_files_and_producer(store, tmp_path):
    store.begin_stage(Producer(asset="web_filtered", partition="s1", mlflow_run_id="abc"))
    out = commit_output(
        store, "web/filtered/s1", _tree(tmp_path / "v1", {"kept/a.gz": b"a" * 10, "m.json": b"{}"})
    )
    got = read_committed(store, "web/filtered/s1")
    assert got.version == out.version and got.names() == ["kept/a.gz", "m.json"]
    assert got.files["kept/a.gz"].bytes == 10
    assert got.producer.mlflow_run_id == "abc"
    assert store.reads["web/filtered/s1"].version == out.version
    assert store.get_bytes(got.key("kept/a.gz")) == b"a" * 10
    assert got.keys(under="kept") == [got.key("kept/a.gz")]


def test_new_version_switches_and_old_versions_are_collected(store, tmp_path):
    v1 = commit_output(store, "o", _tree(tmp_path / "1", {"x": b"1"}))
    v2 = commit_output(store, "o", _tree(tmp_path / "2", {"x": b"22"}))
    v3 = commit_output(store, "o", _tree(tmp_path / "3", {"x": b"333"}))
    assert len({v1.version, v2.version, v3.version}) == 3
    assert read_committed(store, "o").version == v3.version
    # the version before the current one stays for readers mid-read; older ones are gone
    assert sorted(store.list_prefixes("o")) == sorted([f"v-{v2.version}", f"v-{v3.version}"])
    if isinstance(store, LocalStore):  # and no empty directory of a collected version stays on disk
        assert sorted(p.name for p in (store.root / "o").iterdir() if p.is_dir()) == sorted(
            [f"v-{v2.version}", f"v-{v3.version}"]
        )


def test_same_content_gives_same_version(store, tmp_path):
    a = commit_output(store, "o", _tree(tmp_path / "1", {"x": b"1", "y": b"2"}))
    b = commit_output(store, "o", _tree(tmp_path / "2", {"y": b"2", "x": b"1"}))
    assert a.version == b.version


def test_uncommitted_upload_leaves_previous_version_readable(store, tmp_path):
    """A writer killed after uploading some files of a new version but before the pointer switch."""
    v1 = commit_output(store, "o", _tree(tmp_path / "1", {"x": b"old"}))
    store.put_bytes("o/v-" + "f" * 32 + "/x", b"half")  # what a killed writer leaves
    got = read_committed(store, "o")
    assert got.version == v1.version and store.get_bytes(got.key("x")) == b"old"


def test_missing_or_resized_file_fails_the_reader(store, tmp_path):
    out = commit_output(store, "o", _tree(tmp_path / "1", {"a": b"aaaa", "b": b"bb"}))
    store.delete(out.key("b"))
    with pytest.raises(CommitError, match="missing"):
        read_committed(store, "o")
    store.put_bytes(out.key("b"), b"b")
    with pytest.raises(CommitError, match="1 bytes"):
        read_committed(store, "o")


def test_fetch_checks_hashes(store, tmp_path):
    out = commit_output(store, "o", _tree(tmp_path / "1", {"a": b"aaaa"}))
    _, local = fetch_committed(store, "o", tmp_path / "dl")
    assert (local / "a").read_bytes() == b"aaaa"
    store.put_bytes(out.key("a"), b"abcd")  # same size, other bytes
    with pytest.raises(CommitError, match="sha256"):
        fetch_file(store, out, "a", tmp_path / "dl2" / "a")


def test_fetch_into_a_reused_dir_holds_exactly_the_new_version(store, tmp_path):
    commit_output(store, "o", _tree(tmp_path / "1", {"a": b"a1", "sub/b": b"b1"}))
    fetch_committed(store, "o", tmp_path / "dl")
    commit_output(store, "o", _tree(tmp_path / "2", {"a": b"a2"}))
    _, local = fetch_committed(store, "o", tmp_path / "dl")
    assert local == tmp_path / "dl"
    assert sorted(p.relative_to(local).as_posix() for p in local.rglob("*")) == ["a"]  # no sub/, no sub/b
    assert (local / "a").read_bytes() == b"a2"
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left beside it


def test_no_pointer_and_empty_outputs_are_errors(store, tmp_path):
    assert not is_committed(store, "nothing")
    with pytest.raises(CommitError, match="materialize its asset"):
        read_committed(store, "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CommitError, match="empty"):
        commit_output(store, "o", tmp_path / "empty")
    assert commit_output(store, "o", tmp_path / "empty", allow_empty=True).files == {}
