"""Safe unpacking: every trick an archive can play is refused, by name, and nothing stays."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from edgeagent.updates.unpack import UnpackError, unpack_archive
from tests.integration.test_updates_helpers import hostile_archive


def _tar(path: Path, entries: list[tarfile.TarInfo | tuple[str, bytes]]) -> Path:
    path.write_bytes(hostile_archive(entries))
    return path


def _special(name: str, kind: bytes, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info


def _unpack(archive: Path, dest: Path, **limits: int) -> Path:
    return unpack_archive(
        archive,
        dest,
        max_bytes=limits.get("max_bytes", 1 << 20),
        max_files=limits.get("max_files", 10),
    )


def test_a_package_in_one_top_directory_unpacks_with_safe_modes(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "a.tar.gz", [("m/model.toml", b"name='m'"), ("m/w.onnx", b"123")])
    root = _unpack(archive, tmp_path / "out")
    assert root == tmp_path / "out" / "m"
    assert (root / "w.onnx").read_bytes() == b"123"
    assert (root / "w.onnx").stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([("/etc/passwd", b"x")], "absolute path"),
        ([("m/../../evil", b"x")], r"'\.\.'"),
        ([_special("m/link", tarfile.SYMTYPE, "/etc/passwd")], "link"),
        ([_special("m/link", tarfile.SYMTYPE, "model.toml")], "link"),
        ([_special("m/hard", tarfile.LNKTYPE, "../../x")], "link"),
        ([_special("m/dev", tarfile.CHRTYPE)], "device"),
        ([_special("m/fifo", tarfile.FIFOTYPE)], "FIFO"),
        ([("m/model.toml", b"a"), ("m/model.toml", b"b")], "twice"),
        ([("m/readme", b"x")], "no model.toml"),
        ([("model.toml", b"x" * 2000)], "size limit"),
        ([(f"m/f{i}", b"x") for i in range(11)], "file-count"),
        # directories and "./" entries count too (before: 60,000 directories from 287 KB)
        ([_special(f"m/d{i}", tarfile.DIRTYPE) for i in range(11)], "file-count"),
        ([_special("./", tarfile.DIRTYPE) for _ in range(11)], "file-count"),
    ],
)
def test_hostile_archives_are_refused_and_nothing_is_left(
    tmp_path: Path, entries: list, message: str
) -> None:
    archive = _tar(tmp_path / "a.tar.gz", entries)
    with pytest.raises(UnpackError, match=message):
        _unpack(archive, tmp_path / "out", max_bytes=1000)
    assert not (tmp_path / "out").exists()
    assert not (tmp_path / "evil").exists()


def test_a_header_that_understates_the_size_cannot_overrun_the_cap(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "a.tar.gz", [("model.toml", b"x" * 600), ("b.onnx", b"y" * 600)])
    with pytest.raises(UnpackError, match="size limit"):
        _unpack(archive, tmp_path / "out", max_bytes=1000)


def test_garbage_is_not_a_readable_archive(tmp_path: Path) -> None:
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(UnpackError, match="not a readable"):
        _unpack(archive, tmp_path / "out")


def _pax_archive(path: Path, header_bytes: int) -> Path:
    """One entry whose pax header carries ``header_bytes`` of comment."""
    info = tarfile.TarInfo("model.toml")
    info.size = 1
    info.pax_headers = {"comment": "x" * header_bytes}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(info, io.BytesIO(b"x"))
    path.write_bytes(buffer.getvalue())
    return path


def test_an_oversized_pax_header_is_refused_before_it_is_read(tmp_path: Path) -> None:
    archive = _pax_archive(tmp_path / "a.tar.gz", 200_000)
    with pytest.raises(UnpackError, match="extended tar header"):
        unpack_archive(
            archive, tmp_path / "out", max_bytes=1 << 20, max_files=10, max_header_bytes=65536
        )
    assert not (tmp_path / "out").exists()


def test_a_small_pax_header_is_fine(tmp_path: Path) -> None:
    archive = _pax_archive(tmp_path / "a.tar.gz", 1000)
    assert _unpack(archive, tmp_path / "out") == tmp_path / "out"
