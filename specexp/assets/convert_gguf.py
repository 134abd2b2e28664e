"""Dequantize a GGUF checkpoint into a Hugging Face folder that vLLM loads.

Runs inside the vLLM virtualenv (it needs torch and transformers 5.x), so it
imports nothing from specexp. Invoked by ``specexp.assets.embedded``::

    python convert_gguf.py GGUF_FILE OUT_DIR

The output is written to ``OUT_DIR.partial`` and renamed at the end, so an
interrupted conversion never leaves a folder that looks complete.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # transformers 5.x otherwise tries to fetch a GGUF kernel
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def convert(gguf_file: Path, out_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    folder, name = str(gguf_file.parent), gguf_file.name
    model = AutoModelForCausalLM.from_pretrained(
        folder,
        gguf_file=name,
        quantization_config=GgufConfig(gguf_file=name, dequantize=True),
        dtype=torch.bfloat16,
    )
    # save_pretrained refuses a model that still claims to be quantized.
    model.config.quantization_config = None
    if hasattr(model, "hf_quantizer"):
        model.hf_quantizer = None
    model.is_quantized = False
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    tokenizer.save_pretrained(tmp)
    _make_vllm_readable(tmp, tokenizer.chat_template)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)


def _make_vllm_readable(folder: Path, chat_template: str | None) -> None:
    """Patch what transformers 5.x writes so vLLM (and older transformers) read it right."""
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("quantization_config", None)
    rope = cfg.get("rope_parameters") or {}
    # Without a top-level rope_theta vLLM silently uses 10000 and the output is wrong.
    cfg["rope_theta"] = float(rope.get("rope_theta", cfg.get("rope_theta", 100000.0)))
    cfg["torch_dtype"] = "bfloat16"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")

    tok_path = folder / "tokenizer_config.json"
    tok = json.loads(tok_path.read_text())
    tok["tokenizer_class"] = "GPT2Tokenizer"  # 5.x writes a class older versions lack
    tok["add_bos_token"] = False
    if chat_template:
        tok["chat_template"] = chat_template
    tok_path.write_text(json.dumps(tok, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: convert_gguf.py GGUF_FILE OUT_DIR")
    convert(Path(sys.argv[1]), Path(sys.argv[2]))
