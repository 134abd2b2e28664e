"""Write a tiny random Llama that tensor parallelism can split: two heads, two KV heads.

The embedded SmolLM2 has 9 attention heads and 3 KV heads, so vLLM refuses
``--tensor-parallel-size 2`` on it; multi-node tests need a real checkpoint that TP=2
accepts. Weights are random (seeded), the tokenizer is SmolLM2's, so requests, token
counts and the chat template work as with the real model; the text is gibberish. Runs
inside the vLLM virtualenv (torch, transformers) and imports nothing from specexp::

    python tiny_llama.py SMOLLM2_DIR OUT_DIR
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def write(src: Path, out: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    base = json.loads((src / "config.json").read_text())
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=base["vocab_size"],
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=base.get("bos_token_id"),
        eos_token_id=base.get("eos_token_id"),
        pad_token_id=base.get("pad_token_id"),
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    out.mkdir(parents=True)
    model.save_pretrained(out, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (src / name).exists():
            shutil.copy2(src / name, out / name)


if __name__ == "__main__":
    write(Path(sys.argv[1]), Path(sys.argv[2]))
