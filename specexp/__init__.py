"""specexp: speculative-decoding experiment orchestrator for vLLM.

The package follows the pipeline a sweep walks through:
``config`` (compose and expand Hydra overrides into Variants) → ``launch``
(build the ``vllm serve`` plan, validate it, start the server) → ``measure``
(stream requests, scrape ``/metrics``) → ``record`` (result files, MLflow) →
``report`` (tables people read).
"""

__version__ = "0.1.0"
