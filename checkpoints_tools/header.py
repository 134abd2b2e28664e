"""Read safetensors headers (never the weights) through ``safetensors.safe_open``.

safetensors validates a header when it opens the file (``read_metadata`` and
``Metadata::validate``: a 100 MB cap, UTF-8 JSON, known dtypes, offsets that match each
tensor's shape and cover the data buffer without gaps or overlaps), then answers dtype
and shape per tensor. A checkpoint is read lazily: every shard is opened, so every
header is validated and every name listed, but a tensor's dtype and shape are fetched
only when asked for; the module check needs them for about half of the tensors.

Its errors name neither the file nor, always, the tensor; a file it rejects is read
again by ``_diagnose``, the same rules entry by entry, for a one-line reason that does.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterator, KeysView, Mapping
from dataclasses import dataclass
from itertools import repeat
from operator import eq
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

import msgspec
from safetensors import SafetensorError, safe_open

MAX_HEADER_SIZE = 100_000_000
INDEX_NAME = "model.safetensors.index.json"

# bits per element; sub-byte types are packed
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
    "F8_E8M0": 8, "U16": 16, "I16": 16, "F16": 16, "BF16": 16, "U32": 32, "I32": 32, "F32": 32,
    "U64": 64, "I64": 64, "F64": 64, "C64": 64, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}  # fmt: skip


class HeaderError(Exception):
    """The file is not a readable safetensors file; the message names the file and the reason."""


class TensorInfo(NamedTuple):
    dtype: str  # safetensors' name: BF16, F8_E4M3, U8, ...
    shape: tuple[int, ...]


class Tensors(Mapping[str, TensorInfo]):
    """Tensor name → dtype and shape, asked of the open shard that holds the tensor.

    ``where`` maps each tensor to its shard's file name: a sharded checkpoint's index once
    it has been checked against the shards, so 100,000 names are not stored twice."""

    def __init__(self, where: dict[str, str], handles: dict[str, Any]) -> None:
        self._where, self._handles = where, handles  # handles: file name → safe_open object

    def view(self, name: str) -> Any:
        """safetensors' view of one tensor (``get_dtype()``, ``get_shape()``), ``None`` for no
        such tensor: one call per lookup, for the module check's 25,000 lookups per large
        checkpoint."""
        shard = self._where.get(name)
        return None if shard is None else self._handles[shard].get_slice(name)

    def __getitem__(self, name: str) -> TensorInfo:
        view = self._handles[self._where[name]].get_slice(name)
        return TensorInfo(view.get_dtype(), tuple(view.get_shape()))

    def names(self) -> KeysView[str]:
        """The names, for membership tests at C speed."""
        return self._where.keys()

    def __contains__(self, name: object) -> bool:
        return name in self._where

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


@dataclass(frozen=True)
class Header:
    path: Path
    tensors: Tensors
    metadata: dict[str, str]


def _open(path: Path) -> Any:
    try:
        return safe_open(str(path), framework="numpy")
    except SafetensorError as exc:
        _diagnose(path, exc)
    except OSError as exc:
        raise HeaderError(f"{path.name}: cannot read ({exc.strerror or exc})") from None


def read_header(path: Path) -> Header:
    """Open and validate one file; raises HeaderError with one line of reason."""
    handle = _open(path)
    tensors = Tensors(dict.fromkeys(handle.keys(), path.name), {path.name: handle})
    return Header(path, tensors, handle.metadata() or {})


def _diagnose(path: Path, exc: Exception) -> NoReturn:
    """The header's rules, entry by entry, on a file safetensors rejected: the reason in
    words, with the tensor's name; safetensors' own message if these rules find nothing."""
    name = path.name
    data = path.read_bytes()
    if len(data) < 8:
        raise HeaderError(f"{name}: file too small for a safetensors header ({len(data)} bytes)")
    (n,) = struct.unpack("<Q", data[:8])
    if n > MAX_HEADER_SIZE:
        raise HeaderError(f"{name}: header length {n} exceeds the {MAX_HEADER_SIZE} byte limit")
    if 8 + n > len(data):
        raise HeaderError(f"{name}: header length {n} runs past the end of the file ({len(data)} bytes)")
    raw, data_size = data[8 : 8 + n], len(data) - 8 - n
    if not raw.startswith(b"{"):
        raise HeaderError(f"{name}: header does not start with '{{'")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise HeaderError(f"{name}: header is not valid UTF-8 (byte {err.start})") from None
    except json.JSONDecodeError as err:
        raise HeaderError(f"{name}: header is not valid JSON ({err.msg} at {err.pos})") from None
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
    raise HeaderError(f"{name}: rejected by safetensors ({' '.join(str(exc).split())})")


class _Index(msgspec.Struct):
    weight_map: dict[str, str]  # other keys (metadata) are ignored


_DECODE_INDEX = msgspec.json.Decoder(_Index)  # decoded and type-checked in C: 100,000 entries


def _weight_map(index: Path) -> dict[str, str]:
    try:
        weight_map = _DECODE_INDEX.decode(index.read_bytes()).weight_map
    except (OSError, msgspec.DecodeError):
        raise HeaderError(
            f"{index.name}: not a valid index (needs a weight_map object of tensor → shard names)"
        ) from None
    for shard in set(weight_map.values()):
        if "/" in shard or shard.startswith(".."):
            raise HeaderError(f"{index.name}: invalid shard name {shard!r}")
        if not (index.parent / shard).exists():
            raise HeaderError(f"{index.name}: points at missing shard {shard}")
    return weight_map


def read_checkpoint(model_dir: Path) -> Tensors:
    """Every tensor of a checkpoint folder, sharded (index.json) or not; every header
    validated, dtypes and shapes read when asked for. With an index, each shard must hold
    exactly the tensors the index maps to it."""
    if not model_dir.is_dir():
        raise HeaderError(f"{model_dir}: not a directory")
    index = model_dir / INDEX_NAME
    if not index.exists():
        shards = sorted(p.name for p in model_dir.glob("*.safetensors"))
        if not shards:
            raise HeaderError(f"{model_dir}: no *.safetensors files")
        handles = {shard: _open(model_dir / shard) for shard in shards}
        where: dict[str, str] = {}
        for shard, handle in handles.items():
            names = handle.keys()
            if not where.keys().isdisjoint(names):
                tname = min(where.keys() & set(names))
                raise HeaderError(f"{shard}: tensor {tname!r} also appears in {where[tname]}")
            where.update(zip(names, repeat(shard)))
        return Tensors(where, handles)
    weight_map = _weight_map(index)
    handles = {shard: _open(model_dir / shard) for shard in sorted(set(weight_map.values()))}
    listed = 0
    for shard, handle in handles.items():
        names = handle.keys()
        # all mapped here (C-level: no per-tensor bytecode); a tensor in two shards fails in one
        if not all(map(eq, map(weight_map.get, names), repeat(shard))):
            tname = next(t for t in names if weight_map.get(t) != shard)
            where_listed = f"mapped to {weight_map[tname]}" if tname in weight_map else "not listed"
            raise HeaderError(f"{INDEX_NAME}: {tname!r} is {where_listed} but is in {shard}")
        listed += len(names)
    if listed != len(weight_map):  # so some tensor of the index is in no shard
        found = set().union(*(h.keys() for h in handles.values()))
        tname = min(weight_map.keys() - found)
        raise HeaderError(f"{INDEX_NAME}: {tname!r} is mapped to {weight_map[tname]} but is not in it")
    return Tensors(weight_map, handles)
