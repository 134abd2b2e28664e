"""Read safetensors headers (never the weights) with the checks of the reference reader.

Layout: 8 bytes little-endian ``N``, then ``N`` bytes of UTF-8 JSON starting with
``{`` (trailing spaces allowed), then the data buffer. Checks follow
``safetensors/src/tensor.rs::read_metadata`` and ``Metadata::validate``: a size cap of
100 MB, the header inside the file, valid UTF-8 and JSON, known dtypes, offsets that
match each tensor's shape and cover the buffer without gaps or overlaps. Only the
standard library is used: no torch, no numpy.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

MAX_HEADER_SIZE = 100_000_000

# bits per element; sub-byte types are packed
DTYPE_BITS = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E4M3": 8,
    "F8_E5M2": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "F8_E8M0": 8,
    "U16": 16,
    "I16": 16,
    "F16": 16,
    "BF16": 16,
    "U32": 32,
    "I32": 32,
    "F32": 32,
    "U64": 64,
    "I64": 64,
    "F64": 64,
    "C64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}


class HeaderError(Exception):
    """The file is not a readable safetensors file; the message names the file and the reason."""


class TensorInfo(NamedTuple):
    """One tensor's header entry (a tuple: 100,000 of them are built per large checkpoint)."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int
    file: str  # shard file name


@dataclass(frozen=True)
class Header:
    path: Path
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    data_size: int


def read_header(path: Path) -> Header:
    """Parse and validate one file's header; raises HeaderError with one line of reason."""
    name = path.name
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise HeaderError(f"{name}: file too small for a safetensors header ({len(head)} bytes)")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_SIZE:
                raise HeaderError(f"{name}: header length {n} exceeds the {MAX_HEADER_SIZE} byte limit")
            size = path.stat().st_size
            if 8 + n > size:
                raise HeaderError(f"{name}: header length {n} runs past the end of the file ({size} bytes)")
            raw = fh.read(n)
    except OSError as exc:
        raise HeaderError(f"{name}: cannot read ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HeaderError(f"{name}: header is not valid UTF-8 (byte {exc.start})") from None
    if not text.startswith("{"):
        raise HeaderError(f"{name}: header does not start with '{{'")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HeaderError(f"{name}: header is not valid JSON ({exc.msg} at {exc.pos})") from None
    if not isinstance(doc, dict):
        raise HeaderError(f"{name}: header is not a JSON object")
    data_size = size - 8 - n
    return _validate(path, doc, data_size)


def _validate(path: Path, doc: dict[str, object], data_size: int) -> Header:
    name = path.name
    metadata: dict[str, str] = {}
    raw_meta = doc.pop("__metadata__", None)
    if raw_meta is not None:
        if not isinstance(raw_meta, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in raw_meta.items()
        ):
            raise HeaderError(f"{name}: __metadata__ must map strings to strings")
        metadata = dict(raw_meta)
    tensors: dict[str, TensorInfo] = {}
    spans: list[tuple[int, int, str]] = []
    bits = DTYPE_BITS
    for tname, info in doc.items():
        # one tight loop: this runs once per tensor (100,000+ on large checkpoints)
        if type(info) is not dict:
            raise HeaderError(f"{name}: tensor {tname!r} entry is not an object")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        width = bits.get(dtype) if type(dtype) is str else None
        if width is None:
            raise HeaderError(f"{name}: tensor {tname!r} has unknown dtype {dtype!r}")
        if type(shape) is not list:
            raise HeaderError(f"{name}: tensor {tname!r} has an invalid shape {shape!r}")
        count = 1
        for d in shape:
            if type(d) is not int or d < 0:
                raise HeaderError(f"{name}: tensor {tname!r} has an invalid shape {shape!r}")
            count *= d
        if type(offsets) is not list or len(offsets) != 2:
            raise HeaderError(f"{name}: tensor {tname!r} has invalid data_offsets {offsets!r}")
        begin, end = offsets
        if type(begin) is not int or type(end) is not int or not 0 <= begin <= end:
            raise HeaderError(f"{name}: tensor {tname!r} has invalid data_offsets {offsets!r}")
        nbits = count * width
        if nbits % 8 or nbits >> 3 != end - begin:
            raise HeaderError(
                f"{name}: tensor {tname!r} spans {end - begin} bytes but {dtype}{shape} needs {nbits / 8:g}"
            )
        tensors[tname] = TensorInfo(str(dtype), tuple(shape), begin, end, name)
        spans.append((begin, end, tname))
    # the buffer must be covered exactly: sorted by begin, each starts where the previous ended
    spans.sort()
    cursor = 0
    for begin, end, tname in spans:
        if begin != cursor:
            kind = "overlaps the previous tensor" if begin < cursor else "leaves a gap before it"
            raise HeaderError(f"{name}: tensor {tname!r} at offset {begin} {kind} (expected {cursor})")
        cursor = end
    if cursor != data_size:
        raise HeaderError(f"{name}: tensors cover {cursor} bytes but the data buffer holds {data_size}")
    return Header(path, tensors, metadata, data_size)


INDEX_NAME = "model.safetensors.index.json"


def read_checkpoint(model_dir: Path) -> dict[str, TensorInfo]:
    """Every tensor of a checkpoint folder, sharded (index.json) or not; each header read once."""
    if not model_dir.is_dir():
        raise HeaderError(f"{model_dir}: not a directory")
    index = model_dir / INDEX_NAME
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError
        except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError):
            raise HeaderError(f"{index.name}: not a valid index (needs a weight_map object)") from None
        shards = sorted(set(weight_map.values()))
        for shard in shards:
            if not isinstance(shard, str) or "/" in shard or shard.startswith(".."):
                raise HeaderError(f"{index.name}: invalid shard name {shard!r}")
            if not (model_dir / shard).exists():
                raise HeaderError(f"{index.name}: points at missing shard {shard}")
    else:
        shards = sorted(p.name for p in model_dir.glob("*.safetensors"))
        if not shards:
            raise HeaderError(f"{model_dir}: no *.safetensors files")
        weight_map = None
    tensors: dict[str, TensorInfo] = {}
    for shard in shards:
        header = read_header(model_dir / shard)
        for tname, info in header.tensors.items():
            if tname in tensors:
                raise HeaderError(f"{shard}: tensor {tname!r} also appears in {tensors[tname].file}")
            tensors[tname] = info
    if weight_map is not None:
        for tname, shard in weight_map.items():
            got = tensors.get(tname)
            if got is None or got.file != shard:
                raise HeaderError(f"{INDEX_NAME}: {tname!r} is mapped to {shard} but is not in it")
    return tensors
