"""Checkpoint tools: read safetensors headers and check that a checkpoint's quantization
config excludes every module stored unquantized (such as a BF16 MTP layer), and fix it."""
