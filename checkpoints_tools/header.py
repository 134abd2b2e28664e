"""Read safetensors headers (never the weights) with the checks of the reference reader.

Layout: 8 bytes little-endian ``N``, then ``N`` bytes of UTF-8 JSON starting with
``{`` (trailing spaces allowed), then the data buffer. Checks follow
``safetensors/src/tensor.rs::read_metadata`` and ``Metadata::validate``: a size cap of
100 MB, the header inside the file, valid UTF-8 and JSON, known dtypes, offsets that
match each tensor's shape and cover the buffer without gaps or overlaps. No torch, no
numpy: msgspec decodes and type-checks every entry in C (known dtype, non-negative
ints), and what is left (sizes, coverage) runs as list operations, not a per-tensor
Python loop, because large checkpoints carry 100,000+ tensors.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter
from pathlib import Path
from typing import Annotated, Literal, NoReturn

import msgspec

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


Dtype = Literal[
    "BOOL", "U8", "I8", "F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F8_E8M0", "U16", "I16",
    "F16", "BF16", "U32", "I32", "F32", "U64", "I64", "F64", "C64", "F4", "F6_E2M3", "F6_E3M2",
]  # fmt: skip
_Count = Annotated[int, msgspec.Meta(ge=0)]
_MISSING = (-1, -1)


class TensorInfo(msgspec.Struct, frozen=True, gc=False):
    """One tensor's header entry, decoded and type-checked by msgspec (100,000 per large
    checkpoint: a C struct, no Python loop builds it)."""

    dtype: Dtype | None = None  # None: the entry is not a tensor (``__metadata__``) or lacks it
    shape: tuple[_Count, ...] | None = None
    data_offsets: tuple[_Count, _Count] = _MISSING


class _Metadata(msgspec.Struct):
    metadata: dict[str, str] | None = msgspec.field(default=None, name="__metadata__")


class _Index(msgspec.Struct):
    weight_map: dict[str, str]


_DECODE = msgspec.json.Decoder(dict[str, TensorInfo])
_DECODE_INDEX = msgspec.json.Decoder(_Index)
_DECODE_META = msgspec.json.Decoder(_Metadata)


@dataclass(frozen=True)
class Header:
    path: Path
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    data_size: int


def read_header(path: Path) -> Header:
    """Parse and validate one file's header; raises HeaderError with one line of reason.

    The fast path only proves a header good (msgspec's typed decode, then size and
    coverage checks as list comparisons). Anything it rejects is read again by
    ``_diagnose``, the plain per-entry reference check, which names the tensor and the
    reason: errors are rare, their messages matter."""
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
    data_size = size - 8 - n
    if not raw.startswith(b"{"):
        raise HeaderError(f"{name}: header does not start with '{{'")
    try:
        raw.decode("utf-8")  # msgspec would notice bad bytes inside strings only
    except UnicodeDecodeError as exc:
        raise HeaderError(f"{name}: header is not valid UTF-8 (byte {exc.start})") from None
    try:
        tensors = _DECODE.decode(raw)
        metadata = _DECODE_META.decode(raw).metadata if b'"__metadata__"' in raw else None
    except msgspec.ValidationError:
        _diagnose(name, raw, data_size)
    except msgspec.DecodeError as exc:
        raise HeaderError(f"{name}: header is not valid JSON ({exc})") from None
    tensors.pop("__metadata__", None)
    if not _tiles(tensors, data_size):
        _diagnose(name, raw, data_size)
    return Header(path, tensors, metadata or {}, data_size)


def _tiles(tensors: dict[str, TensorInfo], data_size: int) -> bool:
    """Every entry complete, its span the size its dtype and shape need, and the spans
    covering the data buffer exactly (sorted by begin, each starting where the last ended)."""
    entries = list(tensors.values())
    bits = DTYPE_BITS
    try:
        need = [math.prod(e.shape) * bits[e.dtype] for e in entries]  # type: ignore[arg-type,index]
    except (TypeError, KeyError):  # a missing dtype or shape (None)
        return False
    offsets = list(map(attrgetter("data_offsets"), entries))
    if need != [(end - begin) * 8 for begin, end in offsets]:
        return False
    offsets.sort()
    begins = [begin for begin, _ in offsets]
    ends = [end for _, end in offsets]
    return (
        begins[:1] in ([], [0])
        and begins[1:] == ends[:-1]
        and (ends[-1] if ends else 0) == data_size
        and _MISSING not in offsets
    )


def _diagnose(name: str, raw: bytes, data_size: int) -> NoReturn:
    """The reference check, entry by entry, on a header the fast path rejected."""
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise HeaderError(f"{name}: header is not valid JSON ({exc.msg} at {exc.pos})") from None
    if not isinstance(doc, dict):
        raise HeaderError(f"{name}: header is not a JSON object")
    raw_meta = doc.pop("__metadata__", None)
    if raw_meta is not None and (
        not isinstance(raw_meta, dict) or not all(isinstance(v, str) for v in raw_meta.values())
    ):
        raise HeaderError(f"{name}: __metadata__ must map strings to strings")
    spans: list[tuple[int, int, str]] = []
    for tname, info in doc.items():
        if type(info) is not dict:
            raise HeaderError(f"{name}: tensor {tname!r} entry is not an object")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        width = DTYPE_BITS.get(dtype) if type(dtype) is str else None
        if width is None:
            raise HeaderError(f"{name}: tensor {tname!r} has unknown dtype {dtype!r}")
        if type(shape) is not list or any(type(d) is not int or d < 0 for d in shape):
            raise HeaderError(f"{name}: tensor {tname!r} has an invalid shape {shape!r}")
        if type(offsets) is not list or len(offsets) != 2:
            raise HeaderError(f"{name}: tensor {tname!r} has invalid data_offsets {offsets!r}")
        begin, end = offsets
        if type(begin) is not int or type(end) is not int or not 0 <= begin <= end:
            raise HeaderError(f"{name}: tensor {tname!r} has invalid data_offsets {offsets!r}")
        nbits = math.prod(shape) * width
        if nbits % 8 or nbits >> 3 != end - begin:
            raise HeaderError(
                f"{name}: tensor {tname!r} spans {end - begin} bytes but {dtype}{shape} needs {nbits / 8:g}"
            )
        spans.append((begin, end, tname))
    spans.sort()
    cursor = 0
    for begin, end, tname in spans:
        if begin != cursor:
            kind = "overlaps the previous tensor" if begin < cursor else "leaves a gap before it"
            raise HeaderError(f"{name}: tensor {tname!r} at offset {begin} {kind} (expected {cursor})")
        cursor = end
    if cursor != data_size:
        raise HeaderError(f"{name}: tensors cover {cursor} bytes but the data buffer holds {data_size}")
    raise HeaderError(f"{name}: header rejected by the typed reader but not by the reference check")


INDEX_NAME = "model.safetensors.index.json"


def read_checkpoint(model_dir: Path) -> dict[str, TensorInfo]:
    """Every tensor of a checkpoint folder, sharded (index.json) or not; each header read once."""
    if not model_dir.is_dir():
        raise HeaderError(f"{model_dir}: not a directory")
    index = model_dir / INDEX_NAME
    if index.exists():
        try:
            weight_map = _DECODE_INDEX.decode(index.read_bytes()).weight_map
        except (msgspec.DecodeError, OSError):
            raise HeaderError(
                f"{index.name}: not a valid index (needs a weight_map object of tensor → shard names)"
            ) from None
        shards = sorted(set(weight_map.values()))
        for shard in shards:
            if "/" in shard or shard.startswith(".."):  # a str: the index is decoded as dict[str, str]
                raise HeaderError(f"{index.name}: invalid shard name {shard!r}")
            if not (model_dir / shard).exists():
                raise HeaderError(f"{index.name}: points at missing shard {shard}")
    else:
        shards = sorted(p.name for p in model_dir.glob("*.safetensors"))
        if not shards:
            raise HeaderError(f"{model_dir}: no *.safetensors files")
        weight_map = None
    tensors: dict[str, TensorInfo] = {}
    for i, shard in enumerate(shards):
        header = read_header(model_dir / shard)
        if not tensors.keys().isdisjoint(header.tensors):
            tname = min(tensors.keys() & header.tensors.keys())
            other = next(s for s in shards[:i] if tname in read_header(model_dir / s).tensors)
            raise HeaderError(f"{shard}: tensor {tname!r} also appears in {other}")
        if weight_map is not None and not all(
            map(shard.__eq__, map(weight_map.get, header.tensors, repeat(shard)))
        ):  # every tensor the index lists is listed in this shard (C-level: no per-tensor bytecode)
            tname = next(t for t in header.tensors if weight_map.get(t, shard) != shard)
            raise HeaderError(f"{INDEX_NAME}: {tname!r} is mapped to {weight_map[tname]} but is in {shard}")
        tensors.update(header.tensors)
    if weight_map is not None and not weight_map.keys() <= tensors.keys():
        tname = min(weight_map.keys() - tensors.keys())
        raise HeaderError(f"{INDEX_NAME}: {tname!r} is mapped to {weight_map[tname]} but is not in it")
    return tensors
