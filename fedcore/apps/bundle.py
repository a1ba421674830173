"""App bundles: an app directory as one deterministic zip, and unpacking one safely.

``fedcore run`` packs an app directory into a bundle and submits it with the run;
each node fetches the bundle once per run, checks its SHA-256 and unpacks it into a
cache directory named after that hash, so all runs of the same code share one copy.
Packing is deterministic so that unchanged code has the same hash; unpacking trusts
nothing in the bundle, which is whatever a run's submitter sent. What is
left out, the ``.fedcoreignore`` patterns and every check unpacking makes are listed in
docs/deployment.md ("App bundles").

Both functions block (file I/O, compression): async code calls them through
``anyio.to_thread.run_sync``.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import stat
import struct
import tempfile
import unicodedata
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path

from fedcore.apps.project import read_project
from fedcore.errors import AppLoadError, BundleError

MAX_BUNDLE_BYTES = 50 * 2**20
"""Default cap on a bundle's files, added up uncompressed (the zip is smaller)."""
MAX_BUNDLE_FILES = 10_000
"""Default cap on the number of entries in a bundle."""
MAX_COMPRESSION_RATIO = 100
"""Default cap on how many times its compressed size one entry may inflate to."""

IGNORE_FILE = ".fedcoreignore"

_LEFT_OUT_NAMES = frozenset(
    {".git", ".hg", ".svn", ".venv", "venv"}
    | {"__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".hypothesis"}
)
_LEFT_OUT_GLOBS = ("*.pyc", "*.egg-info")
_LEFT_OUT_AT_TOP = frozenset({"build", "dist"})

_DATE_TIME = (1980, 1, 1, 0, 0, 0)
_FILE_MODE = stat.S_IFREG | 0o644
_UNIX = 3
_LEVEL = 6
_CHUNK = 1 << 16
_MAX_COMPONENT_BYTES = 255
_MAX_NAME_BYTES = 1024
_MAX_QUOTE = 80
_MAX_PROBLEM = 200
_LARGEST_SHOWN = 5

_SHA256 = re.compile(r"[0-9a-f]{64}")
_FORBIDDEN = re.compile(r"[\x00-\x1f\x7f\\:]")
_END = struct.Struct("<4s4H2LH")
_END_SIGNATURE = b"PK\x05\x06"
_ZIP64_LOCATOR = b"PK\x06\x07"
_ENTRY_SIGNATURE = b"PK\x01\x02"
_ENCRYPTED = 0x1
# What zipfile raises on a malformed archive (found by feeding it damaged zips): its
# own error, and ones that escape it, such as a negative seek (ValueError) or a feature
# it does not implement. Caught only around zipfile calls, never around fedcore's own.
_ZIP_FAULTS = (
    zipfile.BadZipFile,
    EOFError,
    NotImplementedError,
    ValueError,
    UnicodeDecodeError,
    struct.error,
    zlib.error,
)


@dataclass(frozen=True, slots=True)
class BundleFile:
    """One file of a bundle: its path (``/``-separated, relative) and size in bytes."""

    path: str
    size: int


@dataclass(frozen=True, slots=True)
class Bundle:
    """A packed app: the zip's bytes, their SHA-256 (hex) and the files, in zip order."""

    data: bytes = field(repr=False)
    sha256: str
    files: tuple[BundleFile, ...]


def pack_bundle(
    app_dir: str | os.PathLike[str],
    *,
    max_bytes: int = MAX_BUNDLE_BYTES,
    max_files: int = MAX_BUNDLE_FILES,
) -> Bundle:
    """Zip the app directory ``app_dir`` deterministically, leaving out caches and VCS.

    ``max_bytes`` caps the files' total size, uncompressed, so that whatever is packed
    within the default limits also unpacks within them. Raises :class:`BundleError`.
    """
    _check_limit("max_bytes", max_bytes)
    _check_limit("max_files", max_files)
    root = Path(app_dir)
    _check_app_dir(root)
    found = _collect(root, _read_ignore_file(root))
    _check_layout([path for path, _ in found], (), "cannot pack")
    if "pyproject.toml" not in dict(found):
        raise BundleError(f"{root / IGNORE_FILE} leaves out pyproject.toml; a bundle needs it")
    if len(found) > max_files:
        raise BundleError(
            f"{root} has {len(found):,} files to pack, over the cap of {max_files:,}; "
            f"leave some out with a {IGNORE_FILE} file"
        )
    total = sum(size for _, size in found)
    if total > max_bytes:
        largest = sorted(found, key=lambda item: (-item[1], item[0]))[:_LARGEST_SHOWN]
        shown = ", ".join(f"{path} ({_size(size)})" for path, size in largest)
        raise BundleError(
            f"{root} holds {_size(total)} in {len(found):,} files, over the bundle cap of "
            f"{_size(max_bytes)}; largest: {shown}; leave files out with a {IGNORE_FILE} file"
        )
    buffer = io.BytesIO()
    files = []
    with zipfile.ZipFile(buffer, "w") as archive:
        for path, _ in found:
            content = root.joinpath(path).read_bytes()
            info = zipfile.ZipInfo(path, date_time=_DATE_TIME)
            info.create_system = _UNIX
            info.external_attr = _FILE_MODE << 16
            info.compress_type = _method(content)
            archive.writestr(info, content, compresslevel=_LEVEL)
            files.append(BundleFile(path, len(content)))
    data = buffer.getvalue()
    return Bundle(data, hashlib.sha256(data).hexdigest(), tuple(files))


def bundle_dir(expected_sha256: str, cache_dir: str | os.PathLike[str]) -> Path:
    """Where :func:`unpack_bundle` unpacks the bundle of ``expected_sha256`` in ``cache_dir``.

    A directory there is that bundle, checked when it was unpacked: a caller that finds
    it need not fetch the bundle again. ``BundleError`` for a hash that is not one.
    """
    if not isinstance(expected_sha256, str) or not _SHA256.fullmatch(expected_sha256):
        raise BundleError(
            f"expected_sha256 is not 64 lowercase hex digits: {_quote(str(expected_sha256))}"
        )
    return Path(cache_dir) / expected_sha256


def unpack_bundle(
    data: bytes,
    expected_sha256: str,
    cache_dir: str | os.PathLike[str],
    *,
    max_bytes: int = MAX_BUNDLE_BYTES,
    max_files: int = MAX_BUNDLE_FILES,
    max_ratio: int = MAX_COMPRESSION_RATIO,
    check: Callable[[Path], None] | None = None,
) -> Path:
    """Check ``data`` against its hash and unpack it into ``cache_dir/<sha256>``.

    Returns that directory; when it already exists (an earlier call made it) it is
    returned as is, after ``check``. Raises :class:`BundleError` for a wrong hash or a
    bundle refused by the rules in the module docstring. ``check`` sees the unpacked
    files before they enter the cache: whatever it raises refuses the bundle. A refused
    bundle leaves nothing behind.
    """
    _check_limit("max_bytes", max_bytes)
    _check_limit("max_files", max_files)
    _check_limit("max_ratio", max_ratio)
    target = bundle_dir(expected_sha256, cache_dir)
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected_sha256:
        raise BundleError(f"bundle hash mismatch: expected {expected_sha256}, got {actual}")
    cache = target.parent
    if target.is_dir():
        if check is not None:
            check(target)
        return target
    _check_entry_count(data, max_files)
    with _reading("the central directory"):
        archive = zipfile.ZipFile(io.BytesIO(data))
    with archive:
        entries = _checked_entries(archive, max_files)
        cache.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{expected_sha256[:16]}-", dir=cache))
        try:
            _extract(archive, entries, partial, max_bytes, max_ratio)
            if check is not None:
                check(partial)
            os.rename(partial, target)
        except OSError:
            shutil.rmtree(partial, ignore_errors=True)
            if target.is_dir():  # another unpacker of this bundle finished first
                return target
            raise
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
    return target


def _check_limit(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def _check_app_dir(root: Path) -> None:
    """Refuse a directory whose pyproject.toml does not name a ServerApp and a ClientApp."""
    if not root.is_dir():
        raise BundleError(f"{root} is not a directory")
    try:
        read_project(root)
    except AppLoadError as exc:
        raise BundleError(str(exc)) from None


@dataclass(frozen=True, slots=True)
class _Pattern:
    """One line of a ``.fedcoreignore``, as the module docstring describes."""

    glob: str
    whole_path: bool
    directories_only: bool

    def matches(self, path: str, name: str, is_dir: bool) -> bool:
        if self.directories_only and not is_dir:
            return False
        return fnmatchcase(path if self.whole_path else name, self.glob)


def _read_ignore_file(root: Path) -> tuple[_Pattern, ...]:
    source = root / IGNORE_FILE
    try:
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ()
    except UnicodeDecodeError:
        raise BundleError(f"{source} is not UTF-8 text") from None
    patterns = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("!"):
            raise BundleError(f"{source}:{number}: re-including with '!' is not supported")
        directories_only = line.endswith("/")
        glob = line.rstrip("/")
        whole_path = "/" in glob
        glob = glob.lstrip("/")
        if not glob:
            raise BundleError(f"{source}:{number}: {line!r} matches nothing")
        patterns.append(_Pattern(glob, whole_path, directories_only))
    return tuple(patterns)


def _left_out(path: str, name: str, is_dir: bool, patterns: Iterable[_Pattern]) -> bool:
    if name in _LEFT_OUT_NAMES or any(fnmatchcase(name, glob) for glob in _LEFT_OUT_GLOBS):
        return True
    if path == name and name in _LEFT_OUT_AT_TOP:
        return True
    return any(pattern.matches(path, name, is_dir) for pattern in patterns)


def _collect(root: Path, patterns: tuple[_Pattern, ...]) -> list[tuple[str, int]]:
    """The files to pack, as (relative path, size) sorted by path."""
    found = []
    pending = [""]
    while pending:
        prefix = pending.pop()
        with os.scandir(root / prefix) as listing:
            entries = list(listing)
        for entry in entries:
            path = prefix + entry.name
            is_dir = entry.is_dir(follow_symlinks=False)
            if _left_out(path, entry.name, is_dir, patterns):
                continue
            if entry.is_symlink():
                target = os.readlink(entry.path)
                raise BundleError(
                    f"cannot pack {root / path}: it is a symlink (to {target}); replace it "
                    f"with what it points to, or leave it out with a {IGNORE_FILE} file"
                )
            if is_dir:
                if not os.path.exists(os.path.join(entry.path, "pyvenv.cfg")):
                    pending.append(path + "/")
            elif entry.is_file(follow_symlinks=False):
                found.append((path, entry.stat(follow_symlinks=False).st_size))
            else:
                raise BundleError(
                    f"cannot pack {root / path}: it is not a regular file (a socket, FIFO or "
                    f"device); leave it out with a {IGNORE_FILE} file"
                )
    return sorted(found)


def _method(content: bytes) -> int:
    """Deflate, unless that does not shrink ``content`` or shrinks it like a bomb would."""
    compressor = zlib.compressobj(_LEVEL, zlib.DEFLATED, -15)  # zipfile's raw deflate
    deflated = len(compressor.compress(content)) + len(compressor.flush())
    if deflated < len(content) <= MAX_COMPRESSION_RATIO * deflated:
        return zipfile.ZIP_DEFLATED
    return zipfile.ZIP_STORED


def _check_name(name: str, what: str) -> None:
    """Refuse a path that could land outside its directory, or differently per OS."""

    def refuse(reason: str) -> BundleError:
        return BundleError(f"{what} {_quote(name)}: {reason}")

    if not name:
        raise refuse("the name is empty")
    if name.startswith("/"):
        raise refuse("it is an absolute path")
    forbidden = _FORBIDDEN.search(name)
    if forbidden is not None:
        character = forbidden.group()
        if character == "\\":
            raise refuse("it contains a backslash")
        if character == ":":
            raise refuse("it contains ':' (a drive letter or stream on Windows)")
        raise refuse("it contains a control character")
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:
        raise refuse("the name is not valid UTF-8") from None
    if len(encoded) > _MAX_NAME_BYTES:
        raise refuse(f"the path is longer than {_MAX_NAME_BYTES} bytes")
    for part in name.split("/"):
        if part in ("", ".", ".."):
            raise refuse(f"it has a {part or 'empty'!r} path component")
        if len(part.encode("utf-8")) > _MAX_COMPONENT_BYTES:
            raise refuse(f"a component is longer than {_MAX_COMPONENT_BYTES} bytes")


def _check_layout(files: Iterable[str], dirs: Iterable[str], what: str) -> None:
    """Check each name, then that no two collide and no entry lies under a file."""
    seen: dict[str, str] = {}
    file_keys = set()
    for names, is_file in ((files, True), (dirs, False)):
        for name in names:
            _check_name(name, what)
            key = unicodedata.normalize("NFC", name).casefold()
            if key in seen:
                raise BundleError(
                    f"{what}: {_quote(seen[key])} and {_quote(name)} are the same name, "
                    "or differ only in case or Unicode normalisation"
                )
            seen[key] = name
            if is_file:
                file_keys.add(key)
    for key, name in seen.items():
        parts = key.split("/")
        for depth in range(1, len(parts)):
            parent = "/".join(parts[:depth])
            if parent in file_keys:
                raise BundleError(
                    f"{what}: {_quote(name)} lies under {_quote(seen[parent])}, a file"
                )


def _check_entry_count(data: bytes, max_files: int) -> None:
    """Bound the entries before :mod:`zipfile` builds one object per entry.

    The end record must be the last 22 bytes (no comment), the layout zipfile tries
    first, so both read the same central directory; each entry in it starts with a
    signature, so counting signatures bounds the entries zipfile will parse.
    """
    if len(data) < _END.size:
        raise BundleError("bundle is not a zip archive: too short")
    end = len(data) - _END.size
    signature, *_, directory_size, _, comment_size = _END.unpack_from(data, end)
    if signature != _END_SIGNATURE or comment_size:
        raise BundleError("bundle is not a zip archive without a comment")
    if data[end - 20 : end - 16] == _ZIP64_LOCATOR:
        raise BundleError("bundle is a zip64 archive; bundles are smaller than that")
    if data.count(_ENTRY_SIGNATURE, max(0, end - directory_size), end) > max_files:
        raise BundleError(f"bundle has more than {max_files:,} entries")


def _checked_entries(archive: zipfile.ZipFile, max_files: int) -> list[zipfile.ZipInfo]:
    """The archive's entries, once every rule that needs no inflating has passed."""
    entries = archive.infolist()
    if len(entries) > max_files:
        raise BundleError(f"bundle has {len(entries):,} entries, over the cap of {max_files:,}")
    files: list[str] = []
    dirs: list[str] = []
    for info in entries:
        name = info.orig_filename
        kind = stat.S_IFMT(info.external_attr >> 16)
        is_dir = name.endswith("/")
        if kind == stat.S_IFLNK:
            raise BundleError(f"bundle entry {_quote(name)} is a symlink")
        if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
            raise BundleError(f"bundle entry {_quote(name)} is not a regular file or directory")
        if kind == (stat.S_IFREG if is_dir else stat.S_IFDIR):
            raise BundleError(
                f"bundle entry {_quote(name)} has a file type that contradicts its name"
            )
        if info.flag_bits & _ENCRYPTED:
            raise BundleError(f"bundle entry {_quote(name)} is encrypted")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise BundleError(
                f"bundle entry {_quote(name)} uses compression method {info.compress_type}; "
                "bundles are stored or deflated"
            )
        (dirs if is_dir else files).append(name.removesuffix("/") if is_dir else name)
    _check_layout(files, dirs, "bundle entry")
    return entries


def _extract(
    archive: zipfile.ZipFile,
    entries: list[zipfile.ZipInfo],
    directory: Path,
    max_bytes: int,
    max_ratio: int,
) -> None:
    """Write the entries under ``directory``, counting the bytes actually inflated."""
    total = 0
    for info in entries:
        name = info.orig_filename
        path = directory.joinpath(*name.removesuffix("/").split("/"))
        if name.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        allowed = max_ratio * info.compress_size
        written = 0
        with _reading(_quote(name)):
            source = archive.open(info)
        with source, path.open("xb") as sink:
            while True:
                with _reading(_quote(name)):
                    chunk = source.read(_CHUNK)
                if not chunk:
                    break
                written += len(chunk)
                total += len(chunk)
                if written > allowed:
                    raise BundleError(
                        f"bundle entry {_quote(name)} inflates more than {max_ratio} times "
                        f"its compressed size of {info.compress_size} bytes"
                    )
                if total > max_bytes:
                    raise BundleError(f"bundle inflates to more than {_size(max_bytes)}")
                sink.write(chunk)


@contextmanager
def _reading(name: str) -> Iterator[None]:
    """Turn zipfile's errors about malformed data into one BundleError."""
    try:
        yield
    except _ZIP_FAULTS as exc:
        problem = (str(exc) or type(exc).__name__)[:_MAX_PROBLEM]
        raise BundleError(f"bundle is not a valid zip archive ({name}: {problem})") from None


def _quote(name: str) -> str:
    """``name`` quoted for a message, cut short: a hostile name may be 64 KiB long."""
    text = repr(name)
    return text if len(text) <= _MAX_QUOTE else text[: _MAX_QUOTE - 3] + "..."


def _size(count: int) -> str:
    """A byte count for people: ``512 B``, ``3.2 KiB``, ``50.0 MiB``."""
    if count < 1024:
        return f"{count} B"
    if count < 1024**2:
        return f"{count / 1024:.1f} KiB"
    if count < 1024**3:
        return f"{count / 1024**2:.1f} MiB"
    return f"{count / 1024**3:.1f} GiB"
