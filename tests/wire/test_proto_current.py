"""The committed fedcore/wire/_pb is exactly what protos/ generates, and only wire imports it."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

import fedcore
from fedcore.wire import protogen

STALE = "fedcore/wire/_pb is stale: a .proto changed without `make proto`"


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by relative path, bytecode caches left out."""
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


def test_the_committed_code_is_current_and_generation_is_deterministic(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    protogen.generate(first)
    protogen.generate(second)
    assert tree(first) == tree(second), "generating twice gave different code"
    committed, fresh = tree(protogen.OUTPUT), tree(first)
    assert sorted(committed) == sorted(fresh), STALE
    assert [name for name in fresh if fresh[name] != committed[name]] == [], STALE


def test_a_changed_proto_makes_different_code(tmp_path: Path) -> None:
    """The check above can fail: one new field is one difference."""
    protos = tmp_path / "protos"
    shutil.copytree(protogen.PROTOS, protos)
    chunk_proto = protos / "fedcore" / "v1" / "message.proto"
    text = chunk_proto.read_text(encoding="utf-8")
    chunk_proto.write_text(
        text.replace("  bytes sha256 = 4;\n}", "  bytes sha256 = 4;\n  uint32 spare = 5;\n}"),
        encoding="utf-8",
    )
    protogen.generate(tmp_path / "out", protos)
    fresh, committed = tree(tmp_path / "out"), tree(protogen.OUTPUT)
    assert [name for name in fresh if fresh[name] != committed[name]] == ["fedcore/v1/__init__.py"]
    assert b"spare: int = betterproto.uint32_field(5)" in fresh["fedcore/v1/__init__.py"]


def test_generation_replaces_only_its_own_output(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(ValueError, match="is not generated code"):
        protogen.generate(tmp_path)
    assert (tmp_path / "notes.txt").read_text(encoding="utf-8") == "mine"
    with pytest.raises(ValueError, match=r"holds no \.proto files"):
        protogen.generate(tmp_path / "out", tmp_path)


def importers_of_generated_code(root: Path) -> list[str]:
    """Modules under ``root``, outside its ``wire`` package, that import _pb or betterproto."""
    importers = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if parts[0] == "wire":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or "", *(alias.name for alias in node.names)]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            dotted = [part for name in names for part in name.split(".")]
            if "_pb" in dotted or "betterproto" in dotted:
                importers.append("/".join(parts))
    return importers


def test_only_fedcore_wire_imports_the_generated_code(tmp_path: Path) -> None:
    """tests/test_layers.py skips _pb itself (it imports grpclib); this guards the door."""
    assert importers_of_generated_code(Path(fedcore.__file__).parent) == []
    (tmp_path / "wire").mkdir()
    (tmp_path / "wire" / "fleet.py").write_text("from fedcore.wire._pb import x\n")
    (tmp_path / "roles").mkdir()
    (tmp_path / "roles" / "a.py").write_text("from ..wire._pb.fedcore import v1\n")
    (tmp_path / "roles" / "b.py").write_text("import betterproto\n")
    (tmp_path / "roles" / "c.py").write_text("from fedcore.wire import fleet\n")
    assert importers_of_generated_code(tmp_path) == ["roles/a.py", "roles/b.py"]
