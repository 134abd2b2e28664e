"""Find MTP / next-token-prediction layers in the layouts vLLM knows (vllm-facts §10).

- DeepSeek-V3, GLM-4.x and relatives: extra decoder layers
  ``model.layers.{num_hidden_layers + i}`` for ``i < num_nextn_predict_layers``; the
  multimodal nesting puts them under ``model.language_model.layers.N``.
- Qwen3-Next / Qwen3.5: everything under ``mtp.`` (``mtp.fc``, ``mtp.layers.0``, ...).
- MiMo: ``model.mtp_layers.{i}``.
The layer index is not in the name (seed 003's layer 45 had no "mtp" in it), so the
config's layer counts decide.
"""

from __future__ import annotations

from collections.abc import Iterable

LAYER_PARENTS = ("model.layers.", "model.language_model.layers.", "language_model.model.layers.")
NAMED_MTP_ROOTS = ("mtp.", "model.mtp_layers.", "mtp_layers.")


def mtp_prefixes(names: Iterable[str], num_hidden_layers: int | None, num_mtp_layers: int) -> list[str]:
    """The prefixes (whole layers) that belong to MTP heads, in order."""
    found: dict[str, None] = {}
    names = list(names)
    if num_hidden_layers is not None and num_mtp_layers > 0:
        wanted = {
            f"{parent}{num_hidden_layers + i}" for parent in LAYER_PARENTS for i in range(num_mtp_layers)
        }
        probes = tuple(w + "." for w in wanted)
        for name in names:
            if name in wanted or name.startswith(probes):  # one C call per name
                for w in wanted:
                    if name == w or name.startswith(w + "."):
                        found[w] = None
    for name in names:
        if not name.startswith(NAMED_MTP_ROOTS):
            continue
        for root in NAMED_MTP_ROOTS:
            if name.startswith(root):
                if root == "mtp.":
                    found["mtp"] = None
                else:
                    index = name[len(root) :].split(".", 1)[0]
                    found[f"{root}{index}"] = None
    return sorted(found, key=lambda p: (len(p), p))


def owner(name: str, prefixes: Iterable[str]) -> str | None:
    for p in prefixes:
        if name == p or name.startswith(p + "."):
            return p
    return None
