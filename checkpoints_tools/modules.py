"""Group tensors into modules and tell how each module is stored.

Storage is read from dtypes alone (vllm-facts §8): NVFP4 ModelOpt is a U8 ``weight``
with an F8_E4M3 ``weight_scale`` (and F32 ``weight_scale_2``); NVFP4 compressed-tensors
is a U8 ``weight_packed`` with an F8_E4M3 ``weight_scale``; FP8 is an F8 ``weight``;
anything else is stored as its dtype (BF16, F16, F32).
"""

from __future__ import annotations

from dataclasses import dataclass

from checkpoints_tools.header import TensorInfo

PARAM_SUFFIXES = frozenset(
    {
        "weight",
        "bias",
        "weight_scale",
        "weight_scale_2",
        "input_scale",
        "weight_packed",
        "weight_global_scale",
        "input_global_scale",
        "weight_shape",
        "weight_zero_point",
        "k_scale",
        "v_scale",
    }
)
QUANTIZED = frozenset({"nvfp4-modelopt", "nvfp4-ct", "fp8"})
# Never built as quantized layers by vLLM (embeddings are not Linear; DeepSeek/GLM eh_proj is nn.Linear).
NEVER_QUANTIZED_SUFFIXES = ("embed_tokens", "word_embeddings", "wte", "eh_proj")


@dataclass(frozen=True)
class Module:
    name: str
    storage: str  # nvfp4-modelopt | nvfp4-ct | fp8 | bf16 | f16 | f32 | ...
    shape: tuple[int, ...]
    linear: bool  # a 2-D weight that a quantization config could apply to

    @property
    def quantized(self) -> bool:
        return self.storage in QUANTIZED


def group(tensors: dict[str, TensorInfo]) -> dict[str, Module]:
    params: dict[str, dict[str, TensorInfo]] = {}
    for name, info in tensors.items():
        prefix, _, leaf = name.rpartition(".")
        if leaf in PARAM_SUFFIXES and prefix:
            params.setdefault(prefix, {})[leaf] = info
    modules: dict[str, Module] = {}
    for prefix, p in params.items():
        w = p.get("weight") or p.get("weight_packed")
        if w is None:
            continue
        scale = p.get("weight_scale")
        if "weight_packed" in p and w.dtype == "U8" and scale and scale.dtype.startswith("F8_E4M3"):
            storage = "nvfp4-ct"
        elif w.dtype == "U8" and scale is not None and scale.dtype.startswith("F8_E4M3"):
            storage = "nvfp4-modelopt"
        elif w.dtype.startswith("F8_"):
            storage = "fp8"
        else:
            storage = w.dtype.lower()
        linear = len(w.shape) == 2 and not prefix.endswith(NEVER_QUANTIZED_SUFFIXES)
        modules[prefix] = Module(prefix, storage, w.shape, linear)
    return modules
