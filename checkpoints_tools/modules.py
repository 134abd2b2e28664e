"""Group tensors into modules and tell how each module is stored.

Storage is read from dtypes alone (vllm-facts §8): NVFP4 ModelOpt is a U8 ``weight``
with an F8_E4M3 ``weight_scale`` (and F32 ``weight_scale_2``); NVFP4 compressed-tensors
is a U8 ``weight_packed`` with an F8_E4M3 ``weight_scale``; FP8 is an F8 ``weight``;
anything else is stored as its dtype (BF16, F16, F32).
"""

from __future__ import annotations

from typing import NamedTuple

from checkpoints_tools.header import Tensors

_WEIGHT_LEAVES = (".weight", ".weight_packed")
QUANTIZED = frozenset({"nvfp4-modelopt", "nvfp4-ct", "fp8"})
# Never built as quantized layers by vLLM (embeddings are not Linear; DeepSeek/GLM eh_proj is nn.Linear).
NEVER_QUANTIZED_SUFFIXES = ("embed_tokens", "word_embeddings", "wte", "eh_proj")


class Module(NamedTuple):
    """A tuple, not a frozen dataclass: 25,000 are built per large MoE checkpoint."""

    name: str
    storage: str  # nvfp4-modelopt | nvfp4-ct | fp8 | bf16 | f16 | f32 | ...
    linear: bool  # a 2-D weight that a quantization config could apply to

    @property
    def quantized(self) -> bool:
        return self.storage in QUANTIZED


def _storage(dtype: str, scale_dtype: str | None, packed: bool) -> str:
    fp8_scale = scale_dtype is not None and scale_dtype.startswith("F8_E4M3")
    if packed and dtype == "U8" and fp8_scale:
        return "nvfp4-ct"
    if dtype == "U8" and fp8_scale:
        return "nvfp4-modelopt"
    if dtype.startswith("F8_"):
        return "fp8"
    return dtype.lower()


def group(tensors: Tensors) -> dict[str, Module]:
    """Modules are the prefixes of ``weight`` / ``weight_packed`` tensors; the other
    parameters are looked up by name, so the loop runs per module, not per tensor
    (25,000 modules, 100,000 tensors on large MoE checkpoints), and only the dtypes and
    shapes it needs are read."""
    view, names = tensors.view, tensors.names()
    modules: dict[str, Module] = {}
    storage_of: dict[tuple[str, str | None, bool], str] = {}
    for name in [n for n in names if n.endswith(_WEIGHT_LEAVES)]:
        prefix = name.rpartition(".")[0]
        if not prefix or prefix in modules:
            continue
        w = view(prefix + ".weight")
        packed = w is None or name.endswith("_packed") or (prefix + ".weight_packed") in names
        if w is None:
            w = view(name)
        dtype = w.get_dtype()
        scale = view(prefix + ".weight_scale") if dtype == "U8" else None  # only NVFP4 needs it
        key = (dtype, scale.get_dtype() if scale is not None else None, packed)
        storage = storage_of.get(key)
        if storage is None:
            storage = storage_of[key] = _storage(*key)
        linear = len(w.get_shape()) == 2 and not prefix.endswith(NEVER_QUANTIZED_SUFFIXES)
        modules[prefix] = Module(prefix, storage, linear)
    return modules
