"""Checkpoint tools: read safetensors headers to find unquantized MTP layers (see issue 5)."""
