"""The header reader against real files and adversarial ones: each a clear error, nothing written."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from safetensors import safe_open

from checkpoints_tools.header import DTYPE_BITS, HeaderError, read_checkpoint, read_header
from tests.fixtures.checkpoints import glm_like, write_safetensors


def raw_file(path: Path, header: bytes, data: bytes = b"", n: int | None = None) -> Path:
    path.write_bytes(struct.pack("<Q", len(header) if n is None else n) + header + data)
    return path


def test_written_files_are_real_safetensors(tmp_path: Path) -> None:
    p = tmp_path / "a.safetensors"
    write_safetensors(
        p, {"w": ("BF16", (4, 8)), "s": ("F8_E4M3", (4, 1)), "g": ("F32", ())}, {"format": "pt"}
    )
    with safe_open(str(p), framework="numpy") as f:  # the reference reader accepts them
        assert sorted(f.keys()) == ["g", "s", "w"]
        assert f.metadata() == {"format": "pt"}
    h = read_header(p)
    assert h.tensors["w"].dtype == "BF16" and h.tensors["w"].shape == (4, 8)
    assert h.metadata == {"format": "pt"} and len(h.tensors) == 3 and "g" in h.tensors


def test_golden_bytes_from_the_safetensors_test_suite(tmp_path: Path) -> None:
    p = tmp_path / "g.safetensors"
    p.write_bytes(
        b'@\x00\x00\x00\x00\x00\x00\x00{"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}}   '
        b" \x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    )
    assert read_header(p).tensors["test"].shape == (2, 2)


def _entry(offsets: list[int], dtype: str = "U8", shape: list[int] | None = None) -> dict[str, object]:
    return {"dtype": dtype, "shape": shape or [offsets[1] - offsets[0]], "data_offsets": offsets}


def _json(header: object):  # type: ignore[no-untyped-def]
    return lambda p: raw_file(p, json.dumps(header).encode())


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p.write_bytes(b"\x01\x02\x03"), "too small"),
        (lambda p: raw_file(p, b"{}", n=10_000), "runs past the end"),
        (lambda p: raw_file(p, b"{}", n=100_000_001), "exceeds the 100000000 byte limit"),
        (lambda p: raw_file(p, b'{"a": "\xff\xfe"}'), "not valid UTF-8"),
        (lambda p: raw_file(p, b'  {"a": 1}'), "does not start with '{'"),
        (lambda p: raw_file(p, b'{"a": '), "not valid JSON"),
        (lambda p: raw_file(p, json.dumps({"w": _entry([0, 8])}).encode(), b"\0" * 4), "cover 8 bytes"),
        (
            lambda p: raw_file(
                p, json.dumps({"w": _entry([0, 8]), "v": _entry([4, 12])}).encode(), b"\0" * 12
            ),
            "overlaps",
        ),
        (lambda p: raw_file(p, json.dumps({"w": _entry([2, 8])}).encode(), b"\0" * 8), "gap"),
        (
            lambda p: raw_file(p, json.dumps({"w": _entry([0, 8], "BF16", [3])}).encode(), b"\0" * 8),
            "needs 6",
        ),
        (lambda p: raw_file(p, json.dumps({"w": _entry([0, 4], "Q9")}).encode(), b"\0" * 4), "unknown dtype"),
        (
            lambda p: raw_file(p, json.dumps({"w": _entry([8, 4], "U8", [4])}).encode()),
            "invalid data_offsets",
        ),
        (lambda p: raw_file(p, json.dumps({"__metadata__": {"a": 1}}).encode()), "__metadata__ must map"),
        (lambda p: raw_file(p, b'{"w": 7}'), "'w' entry is not an object"),
        (lambda p: raw_file(p, json.dumps({"w": _entry([0, 4], "U8", [-4])}).encode()), "invalid shape"),
        (lambda p: raw_file(p, json.dumps({"w": _entry([0, 4], "U8", ["4"])}).encode()), "invalid shape"),  # type: ignore[list-item]
        (
            lambda p: raw_file(p, json.dumps({"w": {"dtype": "U8", "data_offsets": [0, 0]}}).encode()),
            "invalid shape None",
        ),
        (
            lambda p: raw_file(p, json.dumps({"w": {"dtype": "U8", "shape": [0]}}).encode()),
            "invalid data_offsets None",
        ),
        (
            lambda p: raw_file(p, json.dumps({"w": {**_entry([0, 0]), "data_offsets": [0, 0, 0]}}).encode()),
            "invalid data_offsets",
        ),
        (lambda p: raw_file(p, b"[1, 2]"), "does not start with"),
        (lambda p: raw_file(p, b'{"w": {"dtype": "U8"}} x'), "not valid JSON"),
        (  # JSON to Python, not to safetensors: its own message, on one line
            lambda p: raw_file(
                p, b'{"w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4], "x": NaN}}', b"\0" * 4
            ),
            r"rejected by safetensors \(Error while deserializing header",
        ),
    ],
)
def test_adversarial_headers_are_clear_errors(tmp_path: Path, make, message: str) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "bad.safetensors"
    make(p)
    before = sorted(tmp_path.iterdir())
    with pytest.raises(HeaderError, match=message) as info:
        read_header(p)
    assert "bad.safetensors" in str(info.value) and "\n" not in str(info.value)
    assert sorted(tmp_path.iterdir()) == before


def test_the_diagnosis_knows_the_dtypes_safetensors_knows(tmp_path: Path) -> None:
    for dtype in DTYPE_BITS:  # 8 elements: a whole number of bytes for every width
        p = tmp_path / f"{dtype}.safetensors"
        write_safetensors(p, {"w": (dtype, (8,))})
        assert read_header(p).tensors["w"] == (dtype, (8,))


def test_index_pointing_at_a_missing_shard(tmp_path: Path) -> None:
    glm_like(tmp_path, shards=2)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(HeaderError, match="missing shard model-00002-of-00002"):
        read_checkpoint(tmp_path)


def test_index_naming_a_tensor_the_shard_lacks(tmp_path: Path) -> None:
    glm_like(tmp_path, shards=2)
    index = tmp_path / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    doc["weight_map"]["model.layers.99.ghost.weight"] = "model-00001-of-00002.safetensors"
    index.write_text(json.dumps(doc))
    with pytest.raises(HeaderError, match="ghost"):
        read_checkpoint(tmp_path)


def _remap(root: Path, change) -> None:  # type: ignore[no-untyped-def]
    index = root / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    change(doc["weight_map"])
    index.write_text(json.dumps(doc))


def test_index_mapping_a_tensor_to_the_wrong_shard_or_not_at_all(tmp_path: Path) -> None:
    glm_like(tmp_path, shards=2)
    _remap(tmp_path, lambda wm: wm.update({"lm_head.weight": "model-00001-of-00002.safetensors"}))
    with pytest.raises(HeaderError, match=r"'lm_head.weight' is mapped to model-00001-of-00002.* but is in"):
        read_checkpoint(tmp_path)
    _remap(tmp_path, lambda wm: wm.pop("lm_head.weight"))
    with pytest.raises(HeaderError, match=r"'lm_head.weight' is not listed but is in model-00002-of-00002"):
        read_checkpoint(tmp_path)


def test_a_tensor_stored_in_two_files_is_named_with_both(tmp_path: Path) -> None:
    write_safetensors(tmp_path / "a.safetensors", {"w": ("U8", (4,)), "x": ("U8", (4,))})
    write_safetensors(tmp_path / "b.safetensors", {"w": ("U8", (4,))})
    with pytest.raises(HeaderError, match=r"^b.safetensors: tensor 'w' also appears in a.safetensors$"):
        read_checkpoint(tmp_path)


def test_a_checkpoint_answers_dtype_and_shape_per_tensor(tmp_path: Path) -> None:
    write_safetensors(tmp_path / "a.safetensors", {"w": ("BF16", (4, 8)), "s": ("F8_E4M3", (4, 1))})
    write_safetensors(tmp_path / "b.safetensors", {"g": ("F32", ())})
    tensors = read_checkpoint(tmp_path)
    assert sorted(tensors) == ["g", "s", "w"] and len(tensors) == 3
    assert tensors["w"] == ("BF16", (4, 8)) and tensors["g"].shape == ()
    assert tensors.view("s").get_dtype() == "F8_E4M3"
    assert tensors.get("nope") is None and tensors.view("nope") is None and "nope" not in tensors


@pytest.mark.parametrize(
    "index", [b"[]", b'{"weight_map": {"a": 1}}', b'{"weight_map": ["x"]}', b"{", b'{"other": {}}']
)
def test_an_invalid_index_is_one_clear_error(tmp_path: Path, index: bytes) -> None:
    glm_like(tmp_path, shards=2)
    (tmp_path / "model.safetensors.index.json").write_bytes(index)
    with pytest.raises(HeaderError, match="not a valid index"):
        read_checkpoint(tmp_path)
