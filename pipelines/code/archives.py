"""Read the files inside fetched sources: .deb (ar + data.tar), Debian source packages (.dsc + tarballs),
npm .tgz, sdists (.tar.gz / .zip) and git checkouts, as (relative path, size, read()) members."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import re
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from infra.code_sources import UPSTREAM_ONLY_MARKER

# below this many uncompressed bytes the ratio is not checked: tar padding and empty files compress far better
RATIO_FLOOR_BYTES = 16 * 1024 * 1024
_READ_CHUNK = 1024 * 1024


class ArchiveError(RuntimeError):
    """An archive is corrupt, of an unknown format or incomplete; the message names the file, `reason` is the
    short stable slug the crawl counts it under (`archive_corrupt`, `archive_unknown_format`,
    `source_incomplete`)."""

    def __init__(self, message: str, reason: str = "archive_corrupt"):
        super().__init__(message)
        self.reason = reason


class ArchiveLimitExceeded(ArchiveError):
    """An archive would expand past one of its `ArchiveLimits`; `reason` is the counted stats key."""

    def __init__(self, reason: str, message: str):
        super().__init__(message, reason)


# What reading a corrupt or truncated archive raises: tarfile, zipfile and each decompressor have their own
# types (gzip.BadGzipFile and bz2's "Invalid data stream" are OSErrors). Anything else is a bug and propagates.
CORRUPT_DATA_ERRORS: tuple[type[Exception], ...] = (
    tarfile.TarError,
    zipfile.BadZipFile,
    zlib.error,
    lzma.LZMAError,
    EOFError,
    OSError,
    UnicodeDecodeError,
)
try:
    import zstandard

    CORRUPT_DATA_ERRORS += (zstandard.ZstdError,)
except ImportError:  # without zstandard a .zst archive cannot be opened at all
    pass


def _is_corrupt_data(exc: BaseException) -> bool:
    """Whether `exc` is what a damaged archive raises, as opposed to a bug in this code."""
    if isinstance(exc, CORRUPT_DATA_ERRORS):
        return True
    if not isinstance(exc, ValueError):
        return False
    # tarfile parses header fields with int() (pax GNU.sparse.*): garbage there is a ValueError from tarfile
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code.co_filename == tarfile.__file__


@dataclass(frozen=True)
class ArchiveLimits:
    """What one source's archives may expand to; past any of these the source is refused, not unpacked."""

    max_total_bytes: int = 2 * 1024**3
    max_members: int = 500_000
    max_member_bytes: int = 512 * 1024**2
    max_ratio: float = 200.0


class _Budget:
    """Members and bytes of one source so far, checked against its limits as the archives stream by."""

    def __init__(self, limits: ArchiveLimits):
        self.limits, self.members, self.declared_bytes, self.read_bytes = limits, 0, 0, 0

    def member(self, what: str, name: str, size: int) -> None:
        self.members += 1
        self.declared_bytes += size
        lim = self.limits
        if self.members > lim.max_members:
            raise ArchiveLimitExceeded(
                "archive_too_many_members",
                f"{what}: more than {lim.max_members} members (archive_max_members)",
            )
        if size > lim.max_member_bytes:
            raise ArchiveLimitExceeded(
                "archive_member_too_large",
                f"{what}: member {name} is {size} bytes, over {lim.max_member_bytes} (archive_max_member_bytes)",
            )
        self._check_total(what, self.declared_bytes)

    def streamed(self, what: str, n: int) -> None:
        self.read_bytes += n
        self._check_total(what, self.read_bytes)

    def _check_total(self, what: str, total: int) -> None:
        if total > self.limits.max_total_bytes:
            raise ArchiveLimitExceeded(
                "archive_too_large",
                f"{what}: expands past {self.limits.max_total_bytes} bytes (archive_max_total_bytes)",
            )


class _MeteredStream:
    """The decompressed bytes of one archive, refused as soon as they pass the total or the ratio limit
    (this bounds everything tarfile reads, long-name and pax headers included)."""

    def __init__(self, stream: BinaryIO, compressed_bytes: int, budget: _Budget, what: str):
        self.stream, self.compressed, self.budget, self.what = stream, max(compressed_bytes, 1), budget, what
        self.produced = 0

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            return b"".join(iter(lambda: self.read(_READ_CHUNK), b""))
        data = self.stream.read(n)
        self.produced += len(data)
        self.budget.streamed(self.what, len(data))
        max_ratio = self.budget.limits.max_ratio
        if self.produced > RATIO_FLOOR_BYTES and self.produced > max_ratio * self.compressed:
            raise ArchiveLimitExceeded(
                "archive_ratio_too_high",
                f"{self.what}: expands more than {max_ratio:g}x its {self.compressed} compressed bytes "
                "(archive_max_ratio)",
            )
        return data


_MAGIC = {
    b"\x1f\x8b": "gz",
    b"\xfd7zXZ\x00": "xz",
    b"\x5d\x00\x00": "xz",
    b"BZh": "bz2",
    b"\x28\xb5\x2f\xfd": "zst",
}


def _decompressing(fh: BinaryIO) -> BinaryIO:
    """`fh` (positioned at the archive's start, seekable) decompressed as a stream, by its magic bytes."""
    head = fh.read(6)
    fh.seek(-len(head), io.SEEK_CUR)
    kind = next((k for magic, k in _MAGIC.items() if head.startswith(magic)), None)
    if kind == "gz":
        return gzip.GzipFile(fileobj=fh, mode="rb")
    if kind == "xz":
        return lzma.LZMAFile(fh)
    if kind == "bz2":
        return bz2.BZ2File(fh)
    if kind == "zst":
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=True)
    return fh


@dataclass
class Member:
    path: str  # relative, '/'-separated, without the archive's top-level directory
    size: int
    read: Callable[[], bytes]


def _strip_top(path: str) -> str:
    parts = _clean(path).split("/", 1)
    return parts[1] if len(parts) == 2 else parts[0]


def _clean(path: str) -> str:
    while path.startswith("./"):
        path = path[2:]
    return path.lstrip("/")


def iter_tar(fileobj_or_path, strip_top: bool, what: str, budget: _Budget | None = None) -> Iterator[Member]:
    """Stream a (compressed) tar: members are read in order, so `read()` must be called before the next one.

    Nothing is decompressed ahead of the member being read; `budget` (default `ArchiveLimits()`) refuses
    the archive with `ArchiveLimitExceeded` as soon as it passes a limit."""
    budget = budget or _Budget(ArchiveLimits())
    if isinstance(fileobj_or_path, (str, Path)):
        with open(fileobj_or_path, "rb") as fh:
            yield from _iter_tar_stream(fh, os.fstat(fh.fileno()).st_size, strip_top, what, budget)
    else:
        start = fileobj_or_path.tell()
        size = fileobj_or_path.seek(0, io.SEEK_END) - start
        fileobj_or_path.seek(start)
        yield from _iter_tar_stream(fileobj_or_path, size, strip_top, what, budget)


def _iter_tar_stream(fh: BinaryIO, compressed_bytes: int, strip_top: bool, what: str, budget: _Budget):
    try:
        stream = _MeteredStream(_decompressing(fh), compressed_bytes, budget, what)
        with tarfile.open(fileobj=stream, mode="r|") as tf:
            for info in tf:
                budget.member(what, info.name, info.size)
                if not info.isfile():
                    continue
                path = _strip_top(info.name) if strip_top else _clean(info.name)
                if not path:
                    continue
                data: list[bytes] = []

                def read(info=info, data=data) -> bytes:
                    if not data:
                        try:
                            member = tf.extractfile(info)
                            data.append(member.read() if member else b"")
                        except Exception as exc:
                            if not _is_corrupt_data(exc):
                                raise  # a limit (already an ArchiveError) or a bug: not a bad source
                            raise ArchiveError(
                                f"{what}: corrupt member {info.name} ({type(exc).__name__}: {exc})"
                            ) from None
                    return data[0]

                yield Member(path, info.size, read)
            # gzip / xz / zstd check their CRC at the end of the stream, which tarfile stops short of: without
            # this, garbled compressed data that still inflates would be read as the archive's content
            while stream.read(_READ_CHUNK):
                pass
    except Exception as exc:
        if not _is_corrupt_data(exc):
            raise
        raise ArchiveError(
            f"{what}: corrupt or unreadable tar archive ({type(exc).__name__}: {exc})"
        ) from None


class _Slice(io.RawIOBase):
    """A read-only window [start, start + size) of a seekable file: one ar member, never loaded whole."""

    def __init__(self, fh: BinaryIO, start: int, size: int):
        self.fh, self.start, self.size, self.pos = fh, start, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = min(max(base + offset, 0), self.size)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, buf) -> int:
        n = min(len(buf), self.size - self.pos)
        if n <= 0:
            return 0
        self.fh.seek(self.start + self.pos)
        data = self.fh.read(n)
        buf[: len(data)] = data
        self.pos += len(data)
        return len(data)


def _ar_members(fh: BinaryIO, what: str) -> dict[str, tuple[int, int]]:
    """{name: (offset, size)} of an ar archive's members, from their headers only."""
    if fh.read(8) != b"!<arch>\n":
        raise ArchiveError(f"{what}: not a Debian package (no ar header)")
    total = os.fstat(fh.fileno()).st_size
    members, pos = {}, 8
    while pos + 60 <= total:
        fh.seek(pos)
        header = fh.read(60)
        name = header[:16].decode("ascii", "replace").strip().rstrip("/")
        try:
            size = int(header[48:58].decode().strip())
        except ValueError:
            raise ArchiveError(f"{what}: corrupt ar member header at byte {pos}") from None
        if pos + 60 + size > total:
            raise ArchiveError(f"{what}: truncated ar member {name!r}")
        members[name] = (pos + 60, size)
        pos += 60 + size + (size % 2)
    return members


def iter_deb(path: Path, budget: _Budget | None = None) -> Iterator[Member]:
    """Files of a binary .deb (the data.tar payload), paths relative to the file-system root."""
    what = path.name
    with open(path, "rb") as fh:
        members = _ar_members(fh, what)
        data_name = next((n for n in members if n.startswith("data.tar")), None)
        if data_name is None:
            raise ArchiveError(f"{what}: no data.tar member in the .deb")
        data = io.BufferedReader(_Slice(fh, *members[data_name]), _READ_CHUNK)
        yield from iter_tar(data, False, what, budget)


def iter_zip(path: Path, strip_top: bool, budget: _Budget | None = None) -> Iterator[Member]:
    """Files of a zip (sdist or wheel); its central directory's sizes are checked before anything is read
    (zipfile never inflates a member past its listed size)."""
    budget = budget or _Budget(ArchiveLimits())
    try:
        zf = zipfile.ZipFile(path)
    except CORRUPT_DATA_ERRORS as exc:
        raise ArchiveError(f"{path.name}: corrupt zip archive ({type(exc).__name__}: {exc})") from None
    with zf:
        infos = [info for info in zf.infolist() if not info.is_dir()]
        for info in infos:
            budget.member(path.name, info.filename, info.file_size)
        expanded, max_ratio = sum(i.file_size for i in infos), budget.limits.max_ratio
        if expanded > RATIO_FLOOR_BYTES and expanded > max_ratio * max(path.stat().st_size, 1):
            raise ArchiveLimitExceeded(
                "archive_ratio_too_high", f"{path.name}: expands more than {max_ratio:g}x (archive_max_ratio)"
            )
        for info in infos:
            rel = _strip_top(info.filename) if strip_top else _clean(info.filename)
            yield Member(rel, info.file_size, lambda info=info: _read_zip_member(zf, info, path.name))


def _read_zip_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, what: str) -> bytes:
    try:
        return zf.read(info)
    except CORRUPT_DATA_ERRORS as exc:  # a bad CRC, truncated or garbled deflate data
        raise ArchiveError(f"{what}: corrupt member {info.filename} ({type(exc).__name__}: {exc})") from None


_DSC_FILE = re.compile(r"^ [0-9a-f]{32,64} \d+ (\S+)$", re.M)


def iter_debian_source(files: list[Path], budget: _Budget | None = None) -> Iterator[Member]:
    """A Debian source package: the upstream tarball(s) then the debian/ tarball listed in the .dsc."""
    budget = budget or _Budget(ArchiveLimits())
    dsc = next((f for f in files if f.suffix == ".dsc"), None)
    if dsc is None:
        raise ArchiveError(f"no .dsc among {[f.name for f in files]}", "source_incomplete")
    names = [
        n
        for n in dict.fromkeys(_DSC_FILE.findall(dsc.read_text(errors="replace")))
        if ".tar" in n and not n.endswith(".asc")
    ]
    if not names:
        raise ArchiveError(f"{dsc.name}: lists no files", "source_incomplete")
    for name in names:
        tar = dsc.parent / name
        if not tar.exists() and ".debian.tar." in name and (dsc.parent / UPSTREAM_ONLY_MARKER).exists():
            continue  # the fetcher kept the upstream code of a package whose debian/ tarball 404'd
        if not tar.exists():
            raise ArchiveError(f"{dsc.name}: lists {name}, which was not downloaded", "source_incomplete")
        is_debian_tar = ".debian.tar." in name
        # component tarballs (orig-COMPONENT.tar.*) unpack into a sub-directory named after the component
        comp = re.search(r"\.orig-([\w-]+)\.tar\.", name)
        for m in iter_tar(tar, strip_top=not is_debian_tar, what=name, budget=budget):
            if comp:
                m.path = f"{comp.group(1)}/{m.path}"
            yield m


def iter_directory(root: Path, budget: _Budget | None = None) -> Iterator[Member]:
    budget = budget or _Budget(ArchiveLimits())
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != ".git")
        for name in sorted(filenames):
            full = Path(dirpath) / name
            if full.is_symlink() or not full.is_file():
                continue
            rel, size = full.relative_to(root).as_posix(), full.stat().st_size
            budget.member(root.name, rel, size)
            yield Member(rel, size, full.read_bytes)


def iter_source_files(kind: str, files: list[Path], limits: ArchiveLimits | None = None) -> Iterator[Member]:
    """Members of one fetched source, whatever its archive format; past any of `limits` (over all of the
    source's archives) it raises `ArchiveLimitExceeded`."""
    budget = _Budget(limits or ArchiveLimits())
    if kind == "git" or (len(files) == 1 and files[0].is_dir()):
        yield from iter_directory(files[0], budget)
        return
    if kind == "debian_source" or any(f.suffix == ".dsc" for f in files):
        yield from iter_debian_source(files, budget)
        return
    for f in files:
        name = f.name.lower()
        if name.endswith(".deb"):
            yield from iter_deb(f, budget)
        elif name.endswith(".zip") or name.endswith(".whl"):
            yield from iter_zip(f, strip_top=not name.endswith(".whl"), budget=budget)
        elif re.search(r"\.(tgz|tar(\.(gz|xz|bz2|zst))?)$", name):
            yield from iter_tar(f, strip_top=True, what=f.name, budget=budget)
        else:
            raise ArchiveError(
                f"{f.name}: unknown archive format (expected .deb, .dsc, .tgz, .tar.*, .zip)",
                "archive_unknown_format",
            )
