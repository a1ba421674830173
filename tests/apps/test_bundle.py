"""App bundles: deterministic packing, and unpacking that refuses every trick it is sent.

Malicious archives are built by hand with :mod:`zipfile` (and, where zipfile will not
write the lie, by patching its bytes); each refusal must leave nothing behind: no
file outside the cache, no half-unpacked directory inside it.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import os
import stat
import struct
import sys
import tempfile
import threading
import unicodedata
import warnings
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedcore.apps import bundle as bundle_module
from fedcore.apps.bundle import (
    Bundle,
    BundleFile,
    pack_bundle,
    unpack_bundle,
)
from fedcore.apps.loading import load_app
from fedcore.errors import BundleError, UsageError

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart-numpy"
PYPROJECT = """\
[project]
name = "demo"

[tool.fedcore.app]
server = "demo.app:server"
client = "demo.app:client"
"""
SOURCE = "def f():\n    return 1\n" * 20

Entry = tuple[str | zipfile.ZipInfo, bytes]


def make_app(root: Path, files: dict[str, str | bytes]) -> Path:
    """An app directory: a pyproject.toml declaring the app, and ``files``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text(PYPROJECT)
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            path.write_text(content)
        else:
            path.write_bytes(content)
    return root


def paths(bundle: Bundle) -> list[str]:
    return [file.path for file in bundle.files]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def zip_of(*entries: Entry, method: int = zipfile.ZIP_DEFLATED) -> bytes:
    """A zip of ``entries`` in order; duplicate names are written as asked."""
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # zipfile warns on duplicate names
        with zipfile.ZipFile(buffer, "w", compression=method) as archive:
            for name, content in entries:
                archive.writestr(name, content)
    return buffer.getvalue()


def info(name: str, mode: int) -> zipfile.ZipInfo:
    entry = zipfile.ZipInfo(name)
    entry.create_system = 3
    entry.external_attr = mode << 16
    return entry


def patch_central(data: bytes, name: bytes, offset: int, fmt: str, value: int) -> bytes:
    """Overwrite one field of ``name``'s central-directory header (APPNOTE 4.3.12)."""
    start = 0
    while True:
        start = data.index(b"PK\x01\x02", start)
        (length,) = struct.unpack_from("<H", data, start + 28)
        if data[start + 46 : start + 46 + length] == name:
            patched = bytearray(data)
            struct.pack_into(fmt, patched, start + offset, value)
            return bytes(patched)
        start += 4


def unpack(data: bytes, cache: Path, **limits: int) -> Path:
    return unpack_bundle(data, sha(data), cache, **limits)


def left_behind(base: Path) -> list[str]:
    """Everything under ``base`` except the (empty) cache directory itself."""
    return sorted(str(p.relative_to(base)) for p in base.rglob("*") if p != base / "cache")


@pytest.fixture
def quickstart_modules(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Forget quickstart_numpy while the test runs, so it is imported from the bundle."""
    monkeypatch.setattr(sys, "path", list(sys.path))

    def ours() -> list[str]:
        return [name for name in sys.modules if name.partition(".")[0] == "quickstart_numpy"]

    saved = {name: sys.modules.pop(name) for name in ours()}
    importlib.invalidate_caches()
    yield
    for name in ours():
        del sys.modules[name]
    sys.modules.update(saved)


# --- packing -------------------------------------------------------------------------


def test_the_same_tree_packs_to_the_same_bytes(tmp_path: Path) -> None:
    app = make_app(tmp_path / "app", {"demo/app.py": SOURCE, "demo/__init__.py": ""})
    first, second = pack_bundle(app), pack_bundle(app)
    assert first.data == second.data
    assert first.sha256 == second.sha256 == sha(first.data)


def test_timestamps_modes_and_creation_order_do_not_change_the_hash(tmp_path: Path) -> None:
    files = {"demo/app.py": SOURCE, "demo/__init__.py": "", "data/x.bin": b"\x00\x01" * 50}
    one = make_app(tmp_path / "one", files)
    two = make_app(tmp_path / "two", dict(reversed(files.items())))
    for number, path in enumerate(sorted(two.rglob("*"))):
        os.utime(path, (1_000_000 + number, 2_000_000_000 - number))
        if path.is_file():
            path.chmod(0o755 if number % 2 else 0o600)
    assert pack_bundle(one).sha256 == pack_bundle(two).sha256


@pytest.mark.parametrize("change", ["edit", "rename", "add empty file"])
def test_a_changed_tree_changes_the_hash(tmp_path: Path, change: str) -> None:
    app = make_app(tmp_path / "app", {"demo/app.py": SOURCE})
    before = pack_bundle(app).sha256
    if change == "edit":
        (app / "demo/app.py").write_text(SOURCE.replace("1", "2", 1))
    elif change == "rename":
        (app / "demo/app.py").rename(app / "demo/app2.py")
    else:
        (app / "demo/empty.py").write_text("")
    assert pack_bundle(app).sha256 != before


def test_entries_are_sorted_plain_files_with_fixed_metadata(tmp_path: Path) -> None:
    app = make_app(tmp_path / "app", {"z.py": SOURCE, "a/b.py": "x = 1\n", "B.txt": "b"})
    (app / "z.py").chmod(0o755)
    bundle = pack_bundle(app)
    with zipfile.ZipFile(io.BytesIO(bundle.data)) as archive:
        entries = archive.infolist()
    assert [e.filename for e in entries] == ["B.txt", "a/b.py", "pyproject.toml", "z.py"]
    for entry in entries:
        assert entry.date_time == (1980, 1, 1, 0, 0, 0)
        assert entry.external_attr >> 16 == stat.S_IFREG | 0o644
        assert entry.create_system == 3
    assert bundle.files == (
        BundleFile("B.txt", 1),
        BundleFile("a/b.py", 6),
        BundleFile("pyproject.toml", len(PYPROJECT)),
        BundleFile("z.py", len(SOURCE)),
    )


def test_caches_version_control_and_environments_are_left_out(tmp_path: Path) -> None:
    kept = ["demo/app.py", "demo/build/keep.py", "demo/dist.py", "pyproject.toml"]
    dropped = [
        ".venv/lib/site.py",
        "venv/lib/site.py",
        "myenv/pyvenv.cfg",
        "myenv/lib/site.py",
        "demo/__pycache__/app.cpython-311.pyc",
        "demo/stale.pyc",
        ".git/config",
        "demo/vendored/.git",
        ".hg/store",
        ".svn/entries",
        ".mypy_cache/x.json",
        ".pytest_cache/v/cache",
        ".ruff_cache/x",
        ".hypothesis/examples/x",
        "demo.egg-info/PKG-INFO",
        "demo/sub.egg-info/PKG-INFO",
        "build/lib/demo/app.py",
        "dist/demo-1.0.tar.gz",
    ]
    app = make_app(tmp_path / "app", dict.fromkeys([*kept[:-1], *dropped], "x"))
    (app / ".venv" / "python").symlink_to("/usr/bin/python3")  # skipped, not refused
    assert paths(pack_bundle(app)) == kept


def test_fedcoreignore_patterns(tmp_path: Path) -> None:
    ignore = """\
# data stays on the nodes

*.csv
data/raw/
/notes.txt
notebooks/*.ipynb
logs/
"""
    files = {
        ".fedcoreignore": ignore,
        "demo/app.py": SOURCE,
        "demo/table.csv": "1,2",
        "data/raw/a.bin": "a",
        "data/raw/deep/b.bin": "b",
        "data/clean/a.bin": "a",
        "notes.txt": "n",
        "demo/notes.txt": "n",
        "notebooks/a.ipynb": "{}",
        "notebooks/sub/b.ipynb": "{}",
        "notebooks/readme.md": "r",
        "logs/run.log": "l",
        "demo/logs": "a file, so the directory-only pattern keeps it",
    }
    app = make_app(tmp_path / "app", files)
    assert paths(pack_bundle(app)) == [
        ".fedcoreignore",
        "data/clean/a.bin",
        "demo/app.py",
        "demo/logs",
        "demo/notes.txt",
        "notebooks/readme.md",
        "pyproject.toml",
    ]


def test_fedcoreignore_refuses_reinclusion(tmp_path: Path) -> None:
    app = make_app(tmp_path / "app", {".fedcoreignore": "*.py\n!keep.py\n"})
    with pytest.raises(BundleError, match=r"\.fedcoreignore:2: re-including with '!'"):
        pack_bundle(app)


def test_pyproject_cannot_be_left_out(tmp_path: Path) -> None:
    app = make_app(tmp_path / "app", {".fedcoreignore": "*.toml\n"})
    with pytest.raises(BundleError, match=r"leaves out pyproject\.toml"):
        pack_bundle(app)


@pytest.mark.parametrize(
    ("pyproject", "message"),
    [
        (None, "has no pyproject.toml"),
        (
            '[project]\nname = "x"\n',
            r"has no \[tool.fedcore.app\] table, nor \[tool.flwr.app.components\]",
        ),
        (
            "[tool.fedcore]\napp = 3\n",
            r"has no \[tool.fedcore.app\] table, nor \[tool.flwr.app.components\]",
        ),
        ("[tool.fedcore.app\n", "is not valid TOML"),
    ],
)
def test_only_app_directories_are_packed(
    tmp_path: Path, pyproject: str | None, message: str
) -> None:
    (tmp_path / "app").mkdir()
    if pyproject is not None:
        (tmp_path / "app" / "pyproject.toml").write_text(pyproject)
    with pytest.raises(BundleError, match=message) as caught:
        pack_bundle(tmp_path / "app")
    assert isinstance(caught.value, UsageError)


def test_a_missing_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="is not a directory"):
        pack_bundle(tmp_path / "nowhere")


@pytest.mark.parametrize("target", ["outside", "inside"])
def test_symlinks_are_refused_wherever_they_point(tmp_path: Path, target: str) -> None:
    app = make_app(tmp_path / "app", {"demo/app.py": SOURCE})
    (tmp_path / "secret.txt").write_text("s")
    pointee = tmp_path / "secret.txt" if target == "outside" else app / "demo" / "app.py"
    (app / "demo" / "link.py").symlink_to(pointee)
    with pytest.raises(BundleError, match=r"demo/link\.py: it is a symlink \(to "):
        pack_bundle(app)
    (app / ".fedcoreignore").write_text("link.py\n")
    assert paths(pack_bundle(app)) == [".fedcoreignore", "demo/app.py", "pyproject.toml"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_special_files_are_refused(tmp_path: Path) -> None:
    app = make_app(tmp_path / "app", {})
    os.mkfifo(app / "pipe")
    with pytest.raises(BundleError, match="pipe: it is not a regular file"):
        pack_bundle(app)


def test_the_size_cap_names_the_total_and_the_largest_files(tmp_path: Path) -> None:
    app = make_app(
        tmp_path / "app", {"big.bin": b"b" * 3000, "data/mid.bin": b"m" * 2000, "s.py": "x"}
    )
    total = 3000 + 2000 + 1 + len(PYPROJECT)
    with pytest.raises(BundleError) as caught:
        pack_bundle(app, max_bytes=4000)
    message = str(caught.value)
    assert f"holds {total / 1024:.1f} KiB in 4 files" in message
    assert "over the bundle cap of 3.9 KiB" in message
    assert "largest: big.bin (2.9 KiB), data/mid.bin (2.0 KiB), pyproject.toml (" in message
    assert ".fedcoreignore" in message
    assert pack_bundle(app, max_bytes=total).files[0] == BundleFile("big.bin", 3000)


def test_the_file_count_cap(tmp_path: Path) -> None:
    app = make_app(tmp_path / "app", {f"m{i}.py": "" for i in range(4)})
    with pytest.raises(BundleError, match="has 5 files to pack, over the cap of 4"):
        pack_bundle(app, max_files=4)
    assert len(pack_bundle(app, max_files=5).files) == 5


def test_highly_compressible_files_are_stored_so_they_unpack(tmp_path: Path) -> None:
    zeros = bytes(1 << 20)
    app = make_app(tmp_path / "app", {"zeros.bin": zeros, "random.bin": os.urandom(4096)})
    bundle = pack_bundle(app)
    with zipfile.ZipFile(io.BytesIO(bundle.data)) as archive:
        methods = {entry.filename: entry.compress_type for entry in archive.infolist()}
    assert methods == {
        "pyproject.toml": zipfile.ZIP_DEFLATED,
        "random.bin": zipfile.ZIP_STORED,
        "zeros.bin": zipfile.ZIP_STORED,
    }
    unpacked = unpack_bundle(bundle.data, bundle.sha256, tmp_path / "cache")
    assert (unpacked / "zeros.bin").read_bytes() == zeros


@pytest.mark.skipif(sys.platform != "linux", reason="needs a case-sensitive file system")
@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["A.py", "a.py"], "differ only in case"),
        (["a\\b.py"], "contains a backslash"),
        (["c:d.py"], "contains ':'"),
        (["tab\there.py"], "control character"),
    ],
)
def test_names_a_node_could_not_unpack_are_refused(
    tmp_path: Path, names: list[str], message: str
) -> None:
    app = make_app(tmp_path / "app", dict.fromkeys(names, "x"))
    with pytest.raises(BundleError, match=message):
        pack_bundle(app)


# --- unpacking -----------------------------------------------------------------------


def test_round_trip_loads_the_quickstart_app(tmp_path: Path, quickstart_modules: None) -> None:
    pytest.importorskip("sklearn")
    bundle = pack_bundle(QUICKSTART)
    assert "pyproject.toml" in paths(bundle)
    assert not any("__pycache__" in path or path.endswith(".pyc") for path in paths(bundle))
    unpacked = unpack_bundle(bundle.data, bundle.sha256, tmp_path / "cache")
    assert unpacked == tmp_path / "cache" / bundle.sha256
    on_disk = sorted(str(p.relative_to(unpacked)) for p in unpacked.rglob("*") if p.is_file())
    assert on_disk == paths(bundle)
    for path in paths(bundle):
        assert (unpacked / path).read_bytes() == (QUICKSTART / path).read_bytes()
    loaded = load_app(unpacked)
    assert loaded.path == unpacked.resolve()
    assert loaded.config is not None
    assert loaded.config["num-server-rounds"] == 30
    module = sys.modules["quickstart_numpy.client_app"]
    assert Path(str(module.__file__)).is_relative_to(unpacked.resolve())


def test_a_second_unpack_reuses_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = pack_bundle(make_app(tmp_path / "app", {"demo/app.py": SOURCE}))
    first = unpack_bundle(bundle.data, bundle.sha256, tmp_path / "cache")

    def no_reading(*args: object) -> None:
        raise AssertionError("the zip was read again")

    monkeypatch.setattr(bundle_module.zipfile, "ZipFile", no_reading)
    assert unpack_bundle(bundle.data, bundle.sha256, tmp_path / "cache") == first
    assert (first / "demo" / "app.py").read_text() == SOURCE


def test_directory_entries_are_accepted(tmp_path: Path) -> None:
    data = zip_of(("pkg/", b""), ("pkg/a.py", b"a = 1\n"), ("empty/", b""))
    unpacked = unpack(data, tmp_path / "cache")
    assert (unpacked / "pkg" / "a.py").read_text() == "a = 1\n"
    assert (unpacked / "empty").is_dir()


class _Refused(Exception):
    """Not a BundleError: a check may fail with anything, and still leave nothing."""


def test_a_bundle_its_check_refuses_never_enters_the_cache(tmp_path: Path) -> None:
    data = zip_of(("pyproject.toml", b"x"), ("big.bin", os.urandom(100_000)))
    seen: list[Path] = []

    def refuse(unpacked: Path) -> None:
        seen.append(unpacked)
        assert (unpacked / "big.bin").stat().st_size == 100_000  # it sees the files
        raise _Refused("no")

    for _ in range(3):
        with pytest.raises(_Refused):
            unpack_bundle(data, sha(data), tmp_path / "cache", check=refuse)
        assert left_behind(tmp_path) == []
    assert all(path.parent == tmp_path / "cache" for path in seen)


def test_a_bundle_its_check_accepts_is_cached_and_checked_again_when_found(
    tmp_path: Path,
) -> None:
    data = zip_of(("pyproject.toml", b"x"))
    seen: list[Path] = []
    target = unpack_bundle(data, sha(data), tmp_path / "cache", check=seen.append)
    assert target == tmp_path / "cache" / sha(data)
    assert (target / "pyproject.toml").read_bytes() == b"x"
    assert unpack_bundle(data, sha(data), tmp_path / "cache", check=seen.append) == target
    assert seen[1] == target  # found in the cache: checked again
    assert seen[0] != target  # the first check saw the files before they entered it


def test_a_wrong_hash_is_refused_before_the_zip_is_read(tmp_path: Path) -> None:
    data = zip_of(("a.py", b"a"))
    with pytest.raises(BundleError, match=r"bundle hash mismatch: expected 0{64}, got"):
        unpack_bundle(data, "0" * 64, tmp_path / "cache")
    with pytest.raises(BundleError, match="hash mismatch"):
        unpack_bundle(b"not a zip at all", sha(data), tmp_path / "cache")
    assert left_behind(tmp_path) == []


@pytest.mark.parametrize("digest", ["../../escape", "A" * 64, "0" * 63, "0" * 64 + "/", ""])
def test_a_malformed_expected_hash_is_refused(tmp_path: Path, digest: str) -> None:
    with pytest.raises(BundleError, match="not 64 lowercase hex digits"):
        unpack_bundle(zip_of(("a.py", b"a")), digest, tmp_path / "cache")
    assert left_behind(tmp_path) == []


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("../evil.py", "'..' path component"),
        ("a/../../evil.py", "'..' path component"),
        ("/tmp/evil.py", "absolute path"),
        ("//server/evil.py", "absolute path"),
        ("C:/evil.py", "drive letter"),
        ("C:evil.py", "drive letter"),
        ("..\\evil.py", "backslash"),
        ("a\\..\\..\\evil.py", "backslash"),
        ("a//evil.py", "'empty' path component"),
        ("./evil.py", "'.' path component"),
        (zipfile.ZipInfo(""), "the name is empty"),
        ("a/" + "x" * 256, "component is longer than 255 bytes"),
        ("a/" * 600 + "x", "longer than 1024 bytes"),
    ],
)
def test_unsafe_entry_names_are_refused(
    tmp_path: Path, name: str | zipfile.ZipInfo, message: str
) -> None:
    data = zip_of(("ok.py", b"fine"), (name, b"evil"))
    with pytest.raises(BundleError, match=message):
        unpack(data, tmp_path / "cache")
    assert left_behind(tmp_path) == []


def test_a_name_cut_short_by_a_nul_byte_is_refused(tmp_path: Path) -> None:
    # zipfile stops a name at NUL, so the name it reports is not the name stored
    data = zip_of(("aaaaaaa.py", b"evil")).replace(b"aaaaaaa.py", b"a\x00/../../x")
    with pytest.raises(BundleError, match="control character"):
        unpack(data, tmp_path / "cache")
    assert left_behind(tmp_path) == []


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (info("link", stat.S_IFLNK | 0o777), "is a symlink"),
        (info("fifo", stat.S_IFIFO | 0o644), "not a regular file or directory"),
        (info("device", stat.S_IFCHR | 0o644), "not a regular file or directory"),
        (info("socket", stat.S_IFSOCK | 0o644), "not a regular file or directory"),
        (info("dir-without-slash", stat.S_IFDIR | 0o755), "contradicts its name"),
        (info("file-with-slash/", stat.S_IFREG | 0o644), "contradicts its name"),
    ],
)
def test_entries_that_are_not_plain_files_are_refused(
    tmp_path: Path, entry: zipfile.ZipInfo, message: str
) -> None:
    data = zip_of(("ok.py", b"fine"), (entry, b"../../../etc/passwd"))
    with pytest.raises(BundleError, match=message):
        unpack(data, tmp_path / "cache")
    assert left_behind(tmp_path) == []


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["a.py", "a.py"], "same name"),
        (["Readme.md", "README.md"], "differ only in case"),
        ([unicodedata.normalize("NFC", "é.py"), unicodedata.normalize("NFD", "é.py")], "same"),
        (["pkg/", "pkg"], "same name"),
        (["a", "a/b.py"], "lies under 'a', a file"),
        (["a", "a/sub/"], "lies under 'a', a file"),
    ],
)
def test_colliding_names_are_refused(tmp_path: Path, names: list[str], message: str) -> None:
    data = zip_of(*[(name, b"" if name.endswith("/") else b"x") for name in names])
    with pytest.raises(BundleError, match=message):
        unpack(data, tmp_path / "cache")
    assert left_behind(tmp_path) == []


def test_a_high_ratio_entry_is_refused_while_inflating(tmp_path: Path) -> None:
    data = zip_of(("ok.py", SOURCE.encode()), ("bomb.bin", bytes(4 << 20)))
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        assert archive.getinfo("bomb.bin").compress_size * 100 < 4 << 20
    with pytest.raises(BundleError, match=r"'bomb\.bin' inflates more than 100 times"):
        unpack(data, tmp_path / "cache")
    assert left_behind(tmp_path) == []
    assert unpack(data, tmp_path / "cache", max_ratio=2000).joinpath("bomb.bin").stat().st_size == (
        4 << 20
    )


@pytest.mark.parametrize(
    ("lie", "message"),
    [
        ("size understated", "Bad CRC-32"),
        ("size zero", "Bad CRC-32"),
        ("compressed size overstated", r"'bomb\.bin' inflates more than 100 times"),
        ("compressed size past the end", "bundle is not a valid zip archive"),
    ],
)
def test_a_bomb_with_a_lying_header_is_refused(tmp_path: Path, lie: str, message: str) -> None:
    """zipfile stops at the size the directory states, then finds the CRC wrong; a
    compressed size stated too large does not buy a bomb more room either."""
    honest = zip_of(("ok.py", SOURCE.encode()), ("bomb.bin", bytes(4 << 20)))
    with zipfile.ZipFile(io.BytesIO(honest)) as archive:
        compressed = archive.getinfo("bomb.bin").compress_size
    offset, value = {
        "size understated": (24, 100),
        "size zero": (24, 0),
        "compressed size overstated": (20, compressed + 64),
        "compressed size past the end": (20, 0xFFFF),
    }[lie]
    data = patch_central(honest, b"bomb.bin", offset, "<I", value)
    with pytest.raises(BundleError, match=message):
        unpack(data, tmp_path / "cache")
    assert left_behind(tmp_path) == []


def test_the_total_size_is_capped_on_the_inflated_bytes(tmp_path: Path) -> None:
    data = zip_of(*[(f"r{i}.bin", os.urandom(400_000)) for i in range(3)])
    with pytest.raises(BundleError, match=r"inflates to more than 1\.0 MiB"):
        unpack(data, tmp_path / "cache", max_bytes=1 << 20)
    assert left_behind(tmp_path) == []
    assert unpack(data, tmp_path / "cache", max_bytes=1_200_000).is_dir()


def test_too_many_entries_are_refused(tmp_path: Path) -> None:
    data = zip_of(*[(f"m{i}.py", b"") for i in range(6)])
    with pytest.raises(BundleError, match="more than 5 entries"):
        unpack(data, tmp_path / "cache", max_files=5)
    assert left_behind(tmp_path) == []
    assert len(list(unpack(data, tmp_path / "cache", max_files=6).iterdir())) == 6


def test_an_entry_count_that_lies_is_not_believed(tmp_path: Path) -> None:
    data = zip_of(*[(f"m{i}.py", b"") for i in range(6)])
    lying = bytearray(data)
    struct.pack_into("<HH", lying, len(data) - 22 + 8, 1, 1)  # "1 entry" in the end record
    with pytest.raises(BundleError, match="more than 5 entries"):
        unpack(bytes(lying), tmp_path / "cache", max_files=5)


def test_archive_comments_encryption_and_other_methods_are_refused(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("a.py", b"a")
        archive.comment = b"hello"
    with pytest.raises(BundleError, match="without a comment"):
        unpack(buffer.getvalue(), tmp_path / "cache")
    encrypted = patch_central(zip_of(("a.py", b"a")), b"a.py", 8, "<H", 0x1)
    with pytest.raises(BundleError, match=r"'a\.py' is encrypted"):
        unpack(encrypted, tmp_path / "cache")
    with pytest.raises(BundleError, match="compression method 12"):
        unpack(zip_of(("a.py", b"a" * 100), method=zipfile.ZIP_BZIP2), tmp_path / "cache")
    assert left_behind(tmp_path) == []


@pytest.mark.parametrize(
    ("limit", "value", "error"),
    [("max_bytes", 0, ValueError), ("max_files", True, TypeError), ("max_ratio", 1.5, TypeError)],
)
def test_limits_are_checked(tmp_path: Path, limit: str, value: object, error: type) -> None:
    with pytest.raises(error, match=limit):
        unpack_bundle(b"", sha(b""), tmp_path, **{limit: value})


def test_concurrent_unpacks_end_with_one_complete_directory(tmp_path: Path) -> None:
    files = {f"demo/m{i}.py": SOURCE * (i + 1) for i in range(40)}
    bundle = pack_bundle(make_app(tmp_path / "app", files))
    threads = 8
    barrier = threading.Barrier(threads)

    def one(_: int) -> Path:
        barrier.wait()
        return unpack_bundle(bundle.data, bundle.sha256, tmp_path / "cache")

    with ThreadPoolExecutor(threads) as pool:
        results = set(pool.map(one, range(threads)))
    assert results == {tmp_path / "cache" / bundle.sha256}
    assert os.listdir(tmp_path / "cache") == [bundle.sha256]
    for name, content in files.items():
        assert (tmp_path / "cache" / bundle.sha256 / name).read_text() == content


# --- garbage -------------------------------------------------------------------------


def unpack_or_refuse(data: bytes) -> None:
    """Unpack ``data`` (with its own hash) in a fresh directory: a refusal is fine,
    any other exception fails, and nothing may land outside the cache."""
    with tempfile.TemporaryDirectory() as base:
        cache = Path(base) / "cache"
        try:
            unpacked = unpack(data, cache, max_bytes=1 << 20)
        except BundleError:
            assert left_behind(Path(base)) == []
        else:
            assert unpacked.parent == cache
            assert [p.name for p in cache.iterdir()] == [unpacked.name]


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=600))
def test_arbitrary_bytes_are_refused_cleanly(data: bytes) -> None:
    unpack_or_refuse(data)


@st.composite
def damaged_zips(draw: st.DrawFn) -> bytes:
    """A small zip with a few of its bytes overwritten, and perhaps cut short."""
    names = draw(st.lists(st.sampled_from(["a.py", "p/b.py", "p/", "c", "d/e/f"]), unique=True))
    method = draw(st.sampled_from([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED]))
    entries = [(n, b"" if n.endswith("/") else draw(st.binary(max_size=300))) for n in names]
    data = bytearray(zip_of(*entries, method=method))
    end_record = len(data) - 22
    # Mostly before the end record, whose damage is refused early and always the same way.
    where = st.integers(0, max(0, end_record - 1)) | st.integers(end_record, len(data) - 1)
    for _ in range(draw(st.integers(0, 4))):
        position = draw(where)
        patch = draw(st.binary(min_size=1, max_size=4))
        data[position : position + len(patch)] = patch
    if draw(st.booleans()):
        data = data[: draw(st.integers(0, len(data)))]
    return bytes(data)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damaged_zips())
def test_damaged_zips_unpack_or_are_refused_cleanly(data: bytes) -> None:
    unpack_or_refuse(data)
