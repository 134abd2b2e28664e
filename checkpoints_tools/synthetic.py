"""Write small but real safetensors checkpoints in the layouts the tools must understand.

Used by the tests and the scan benchmark: tensors are tiny and zero-filled, headers are
exactly what quantizers write (names, dtypes, shapes, offsets), so the tools see what
they would see on a 500 GB checkpoint.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

from checkpoints_tools.header import DTYPE_BITS

Spec = dict[str, tuple[str, tuple[int, ...]]]  # name -> (dtype, shape)

H, FF, E = 64, 128, 2  # hidden, intermediate, experts (tiny)


def write_safetensors(path: Path, tensors: Spec, metadata: dict[str, str] | None = None) -> None:
    header: dict[str, Any] = {}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        size = math.prod(shape) * DTYPE_BITS[dtype] // 8
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    if metadata:
        header["__metadata__"] = metadata
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # padded with spaces, as the spec allows
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        fh.write(b"\0" * offset)


def linear(prefix: str, storage: str, out: int, inp: int) -> Spec:
    if storage == "nvfp4-modelopt":
        return {
            f"{prefix}.weight": ("U8", (out, inp // 2)),
            f"{prefix}.weight_scale": ("F8_E4M3", (out, inp // 16)),
            f"{prefix}.weight_scale_2": ("F32", ()),
            f"{prefix}.input_scale": ("F32", ()),
        }
    if storage == "nvfp4-ct":
        return {
            f"{prefix}.weight_packed": ("U8", (out, inp // 2)),
            f"{prefix}.weight_scale": ("F8_E4M3", (out, inp // 16)),
            f"{prefix}.weight_global_scale": ("F32", (1,)),
            f"{prefix}.input_global_scale": ("F32", (1,)),
        }
    return {f"{prefix}.weight": (storage.upper(), (out, inp))}


def decoder_layer(prefix: str, storage: str, router: str = "bf16") -> Spec:
    t: Spec = {}
    for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
        t |= linear(f"{prefix}.self_attn.{proj}", storage, H, H)
    t[f"{prefix}.mlp.gate.weight"] = (router.upper() if router != "same" else "BF16", (E, H))
    for e in range(E):
        for proj, (o, i) in {"gate_proj": (FF, H), "up_proj": (FF, H), "down_proj": (H, FF)}.items():
            t |= linear(f"{prefix}.mlp.experts.{e}.{proj}", storage, o, i)
    t[f"{prefix}.input_layernorm.weight"] = ("BF16", (H,))
    t[f"{prefix}.post_attention_layernorm.weight"] = ("BF16", (H,))
    return t


def glm_like(
    root: Path,
    *,
    fmt: str = "modelopt",
    layers: int = 5,
    nested: bool = False,
    shards: int = 2,
    ignore: list[str] | None = None,
    text_config_copy: bool = True,
) -> Path:
    """GLM-4.x / DeepSeek layout: ``layers`` quantized decoder layers plus one BF16 MTP layer."""
    root.mkdir(parents=True, exist_ok=True)
    base = "model.language_model" if nested else "model"
    storage = "nvfp4-modelopt" if fmt == "modelopt" else "nvfp4-ct"
    t: Spec = {f"{base}.embed_tokens.weight": ("BF16", (256, H))}
    for i in range(layers):
        t |= decoder_layer(f"{base}.layers.{i}", storage)
    m = f"{base}.layers.{layers}"
    t |= decoder_layer(m, "bf16")
    t |= {
        f"{m}.eh_proj.weight": ("BF16", (H, 2 * H)),
        f"{m}.enorm.weight": ("BF16", (H,)),
        f"{m}.hnorm.weight": ("BF16", (H,)),
        f"{m}.shared_head.norm.weight": ("BF16", (H,)),
        f"{base}.norm.weight": ("BF16", (H,)),
        "lm_head.weight": ("BF16", (256, H)),
    }
    _write_sharded(root, t, shards)
    default_ignore = ["lm_head", "*mlp.gate"] if fmt == "modelopt" else ["lm_head", "re:.*mlp[.]gate$"]
    qc: dict[str, Any]
    if fmt == "modelopt":
        qc = {
            "quant_method": "modelopt",
            "quant_algo": "NVFP4",
            "group_size": 16,
            "ignore": ignore if ignore is not None else default_ignore,
        }
    else:
        qc = {
            "quant_method": "compressed-tensors",
            "format": "nvfp4-pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4}}},
            "ignore": ignore if ignore is not None else default_ignore,
        }
    counts = {"num_hidden_layers": layers, "num_nextn_predict_layers": 1, "hidden_size": H}
    cfg: dict[str, Any] = {"architectures": ["Glm4MoeForCausalLM"], "quantization_config": qc}
    if nested:
        cfg["text_config"] = dict(counts)
        if text_config_copy:
            cfg["text_config"]["quantization_config"] = json.loads(json.dumps(qc))
    else:
        cfg |= counts
    (root / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return root


def qwen3_next_like(root: Path, *, layers: int = 3) -> Path:
    """Qwen3-Next layout: body NVFP4 (ModelOpt), MTP under ``mtp.*`` in BF16."""
    root.mkdir(parents=True, exist_ok=True)
    t: Spec = {"model.embed_tokens.weight": ("BF16", (256, H))}
    for i in range(layers):
        t |= decoder_layer(f"model.layers.{i}", "nvfp4-modelopt")
    t |= {
        "mtp.fc.weight": ("BF16", (H, 2 * H)),
        "mtp.pre_fc_norm_embedding.weight": ("BF16", (H,)),
        "mtp.pre_fc_norm_hidden.weight": ("BF16", (H,)),
        "mtp.norm.weight": ("BF16", (H,)),
    }
    t |= decoder_layer("mtp.layers.0", "bf16")
    t["lm_head.weight"] = ("BF16", (256, H))
    _write_sharded(root, t, 1)
    cfg = {
        "architectures": ["Qwen3NextForCausalLM"],
        "num_hidden_layers": layers,
        "num_nextn_predict_layers": 1,
        "quantization_config": {
            "quant_method": "modelopt",
            "quant_algo": "NVFP4",
            "exclude_modules": ["lm_head", "*mlp.gate"],
        },
    }
    (root / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return root


def _write_sharded(root: Path, tensors: Spec, shards: int) -> None:
    names = list(tensors)
    if shards <= 1:
        write_safetensors(root / "model.safetensors", tensors, {"format": "pt"})
        return
    per = math.ceil(len(names) / shards)
    weight_map: dict[str, str] = {}
    for s in range(shards):
        part = names[s * per : (s + 1) * per]
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(root / fname, {n: tensors[n] for n in part}, {"format": "pt"})
        weight_map |= dict.fromkeys(part, fname)
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}, indent=2)
    )
