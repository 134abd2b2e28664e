"""Check ``vllm serve`` argument lists with the installed vLLM's own parser and config classes.

Runs inside the vLLM virtualenv (it imports vllm), so it imports nothing from
specexp. Reads a JSON list of ``{"id": str, "argv": [...], "engine": bool}``
on stdin, where ``argv`` is everything after ``vllm serve``, and writes a JSON
list of ``{"id", "ok", "error", "checked"}`` to stdout. Importing vLLM costs
seconds; each check costs milliseconds, so every variant of a sweep goes
through one process.

Levels, in order (``checked`` lists the ones that ran):
- ``argparse``: unknown flag, wrong type, bad choice (vLLM's own serve parser);
- ``serve-args``: ``validate_parsed_serve_args``;
- ``attention``: ``--attention-backend`` and the speculative config's
  ``attention_backend`` are members of ``AttentionBackendEnum``;
- ``speculative-config``: JSON keys are fields of ``SpeculativeConfig`` and
  ``method`` is one of its methods;
- ``engine-config``: ``create_engine_config()`` (needs the model files, so
  only when ``engine`` is true).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
import typing
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


def _literal_values(tp: Any) -> set[str]:
    out: set[str] = set()
    for arg in typing.get_args(tp):
        if isinstance(arg, str):
            out.add(arg)
        else:
            out |= _literal_values(arg)
    return out


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    # pydantic errors put the useful part on the second and third lines
    return " | ".join(lines[:4])


def main() -> int:
    requests = json.load(sys.stdin)
    logging.disable(logging.WARNING)
    import dataclasses

    from vllm.config import speculative as spec_mod
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    spec_fields = {f.name for f in dataclasses.fields(spec_mod.SpeculativeConfig)}
    spec_methods = _literal_values(spec_mod.SpeculativeMethod)
    backends = {m.name for m in AttentionBackendEnum}

    def check_backend(name: str | None, where: str) -> None:
        if name is None or str(name).lower() == "auto":
            return
        if str(name).upper() not in backends:
            raise ValueError(
                f"{where}: unknown attention backend {name!r}; this vLLM knows " + ", ".join(sorted(backends))
            )

    results = []
    for req in requests:
        checked: list[str] = []
        error = None
        try:
            parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
            err = io.StringIO()
            try:
                with contextlib.redirect_stderr(err):
                    ns = parser.parse_args(req["argv"])
            except SystemExit:
                msg = [ln for ln in err.getvalue().splitlines() if ln.strip()]
                raise ValueError(msg[-1] if msg else "argument parsing failed") from None
            checked.append("argparse")
            if getattr(ns, "model_tag", None):  # `vllm serve MODEL` copies the positional the same way
                ns.model = ns.model_tag
            validate_parsed_serve_args(ns)
            checked.append("serve-args")
            check_backend(getattr(ns, "attention_backend", None), "--attention-backend")
            spec = getattr(ns, "speculative_config", None)
            if isinstance(spec, str):
                spec = json.loads(spec)
            if spec:
                check_backend(spec.get("attention_backend"), "speculative_config.attention_backend")
            checked.append("attention")
            if spec:
                unknown = sorted({k.replace("-", "_") for k in spec} - spec_fields)
                if unknown:
                    raise ValueError(f"speculative_config: unknown key(s) {unknown}")
                method = spec.get("method")
                if method is not None and method not in spec_methods:
                    raise ValueError(
                        f"speculative_config.method: {method!r} is not one of "
                        + ", ".join(sorted(spec_methods))
                    )
                checked.append("speculative-config")
            if req.get("engine"):
                AsyncEngineArgs.from_cli_args(ns).create_engine_config()
                checked.append("engine-config")
        except Exception as exc:  # every failure is reported, none is fatal
            error = _one_line(exc)
        results.append({"id": req["id"], "ok": error is None, "error": error, "checked": checked})
    json.dump(results, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
