"""Read the files inside fetched sources: .deb (ar + data.tar), Debian source packages (.dsc + tarballs),
npm .tgz, sdists (.tar.gz / .zip) and git checkouts, as (relative path, size, read()) members."""

from __future__ import annotations

import io
import os
import re
import tarfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from infra.code_sources import UPSTREAM_ONLY_MARKER


class ArchiveError(RuntimeError):
    """An archive is corrupt or of an unknown format; the message names the file."""


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


def iter_tar(fileobj_or_path, strip_top: bool, what: str) -> Iterator[Member]:
    """Stream a (compressed) tar: members are read in order, so `read()` must be called before the next one."""
    try:
        if isinstance(fileobj_or_path, (str, Path)):
            if str(fileobj_or_path).endswith(".zst"):
                yield from _iter_zst_tar(Path(fileobj_or_path), strip_top, what)
                return
            tf = tarfile.open(fileobj_or_path, mode="r|*")
        else:
            tf = tarfile.open(fileobj=fileobj_or_path, mode="r|*")
        with tf:
            for info in tf:
                if not info.isfile():
                    continue
                path = _strip_top(info.name) if strip_top else _clean(info.name)
                if not path:
                    continue
                data: list[bytes] = []

                def read(info=info, data=data) -> bytes:
                    if not data:
                        try:
                            fh = tf.extractfile(info)
                            data.append(fh.read() if fh else b"")
                        except Exception as exc:  # tarfile, lzma, zlib and bz2 each raise their own types
                            raise ArchiveError(f"{what}: corrupt member {info.name} ({exc!r})") from None
                    return data[0]

                yield Member(path, info.size, read)
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        raise ArchiveError(
            f"{what}: corrupt or unreadable tar archive ({type(exc).__name__}: {exc})"
        ) from None
    except Exception as exc:  # lzma/zlib raise their own error types on truncated data
        if type(exc).__module__ in ("lzma", "zlib", "_compression", "bz2", "zstd", "zstandard"):
            raise ArchiveError(f"{what}: corrupt compressed data ({type(exc).__name__}: {exc})") from None
        raise


def _iter_zst_tar(path_or_bytes, strip_top: bool, what: str) -> Iterator[Member]:
    import zstandard

    raw = path_or_bytes.read_bytes() if isinstance(path_or_bytes, Path) else path_or_bytes
    try:
        data = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw)).read()
    except zstandard.ZstdError as exc:
        raise ArchiveError(f"{what}: corrupt zstd data ({exc})") from None
    yield from iter_tar(io.BytesIO(data), strip_top, what)


def _ar_members(data: bytes, what: str) -> dict[str, bytes]:
    if not data.startswith(b"!<arch>\n"):
        raise ArchiveError(f"{what}: not a Debian package (no ar header)")
    members, pos = {}, 8
    while pos + 60 <= len(data):
        header = data[pos : pos + 60]
        name = header[:16].decode("ascii", "replace").strip().rstrip("/")
        try:
            size = int(header[48:58].decode().strip())
        except ValueError:
            raise ArchiveError(f"{what}: corrupt ar member header at byte {pos}") from None
        body = data[pos + 60 : pos + 60 + size]
        if len(body) != size:
            raise ArchiveError(f"{what}: truncated ar member {name!r}")
        members[name] = body
        pos += 60 + size + (size % 2)
    return members


def iter_deb(path: Path) -> Iterator[Member]:
    """Files of a binary .deb (the data.tar payload), paths relative to the file-system root."""
    what = path.name
    members = _ar_members(path.read_bytes(), what)
    data_name = next((n for n in members if n.startswith("data.tar")), None)
    if data_name is None:
        raise ArchiveError(f"{what}: no data.tar member in the .deb")
    if data_name.endswith(".zst"):
        yield from _iter_zst_tar(members[data_name], False, what)
    else:
        yield from iter_tar(io.BytesIO(members[data_name]), False, what)


def iter_zip(path: Path, strip_top: bool) -> Iterator[Member]:
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ArchiveError(f"{path.name}: corrupt zip archive ({exc})") from None
    with zf:
        for info in zf.infolist():
            if info.is_dir():
                continue
            rel = _strip_top(info.filename) if strip_top else _clean(info.filename)
            yield Member(rel, info.file_size, lambda info=info: zf.read(info))


_DSC_FILE = re.compile(r"^ [0-9a-f]{32,64} \d+ (\S+)$", re.M)


def iter_debian_source(files: list[Path]) -> Iterator[Member]:
    """A Debian source package: the upstream tarball(s) then the debian/ tarball listed in the .dsc."""
    dsc = next((f for f in files if f.suffix == ".dsc"), None)
    if dsc is None:
        raise ArchiveError(f"no .dsc among {[f.name for f in files]}")
    names = [
        n
        for n in dict.fromkeys(_DSC_FILE.findall(dsc.read_text(errors="replace")))
        if ".tar" in n and not n.endswith(".asc")
    ]
    if not names:
        raise ArchiveError(f"{dsc.name}: lists no files")
    for name in names:
        tar = dsc.parent / name
        if not tar.exists() and ".debian.tar." in name and (dsc.parent / UPSTREAM_ONLY_MARKER).exists():
            continue  # the fetcher kept the upstream code of a package whose debian/ tarball 404'd
        if not tar.exists():
            raise ArchiveError(f"{dsc.name}: lists {name}, which was not downloaded")
        is_debian_tar = ".debian.tar." in name
        # component tarballs (orig-COMPONENT.tar.*) unpack into a sub-directory named after the component
        comp = re.search(r"\.orig-([\w-]+)\.tar\.", name)
        for m in iter_tar(tar, strip_top=not is_debian_tar, what=name):
            if comp:
                m.path = f"{comp.group(1)}/{m.path}"
            yield m


def iter_directory(root: Path) -> Iterator[Member]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != ".git")
        for name in sorted(filenames):
            full = Path(dirpath) / name
            if full.is_symlink() or not full.is_file():
                continue
            yield Member(full.relative_to(root).as_posix(), full.stat().st_size, full.read_bytes)


def iter_source_files(kind: str, files: list[Path]) -> Iterator[Member]:
    """Members of one fetched source, whatever its archive format."""
    if kind == "git" or (len(files) == 1 and files[0].is_dir()):
        yield from iter_directory(files[0])
        return
    if kind == "debian_source" or any(f.suffix == ".dsc" for f in files):
        yield from iter_debian_source(files)
        return
    for f in files:
        name = f.name.lower()
        if name.endswith(".deb"):
            yield from iter_deb(f)
        elif name.endswith(".zip") or name.endswith(".whl"):
            yield from iter_zip(f, strip_top=not name.endswith(".whl"))
        elif re.search(r"\.(tgz|tar(\.(gz|xz|bz2|zst))?)$", name):
            yield from iter_tar(f, strip_top=True, what=f.name)
        else:
            raise ArchiveError(f"{f.name}: unknown archive format (expected .deb, .dsc, .tgz, .tar.*, .zip)")
