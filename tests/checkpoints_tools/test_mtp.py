from __future__ import annotations

from checkpoints_tools.mtp import mtp_prefixes, owner


def test_layer_index_layouts_from_config_counts() -> None:
    names = [
        "model.layers.44.mlp.gate",
        "model.layers.45.eh_proj",
        "model.layers.45.mlp.experts.0.up_proj",
        "model.layers.450.x",
    ]
    assert mtp_prefixes(names, num_hidden_layers=45, num_mtp_layers=1) == ["model.layers.45"]
    assert mtp_prefixes(names, num_hidden_layers=45, num_mtp_layers=0) == []  # counts decide, not names


def test_named_layouts_and_multimodal_nesting() -> None:
    assert mtp_prefixes(["mtp.fc", "mtp.layers.0.self_attn.q_proj"], 48, 1) == ["mtp"]
    assert mtp_prefixes(["model.mtp_layers.0.input_proj", "model.mtp_layers.1.input_proj"], 36, 0) == [
        "model.mtp_layers.0",
        "model.mtp_layers.1",
    ]
    nested = ["model.language_model.layers.92.self_attn.q_proj", "model.language_model.layers.91.x"]
    assert mtp_prefixes(nested, 92, 1) == ["model.language_model.layers.92"]
    assert owner("model.layers.45.mlp", ["model.layers.45"]) == "model.layers.45"
    assert owner("model.layers.450.mlp", ["model.layers.45"]) is None
