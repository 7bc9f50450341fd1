#!/usr/bin/env bash
# Sets up a fresh Debian machine (root) for Nereus development and tests: the CPU build of torch,
# the package with every extra, and the system packages the tests use (a local Slurm, munge,
# hdf5-tools, hipcc for the HIP kernels' compile check). Idempotent; safe to rerun.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
PY=${PYTHON:-python3}

# CPU build of torch first, so no extra pulls a multi-GB CUDA build (DeepSpeed's sdist builds
# against it; DS_BUILD_OPS=0: its ops are compiled on first use, not at install).
"$PY" -m pip install -q "torch==2.13.0"
DS_BUILD_OPS=0 "$PY" -m pip install -q -e ".[all,dev]"
# The package's bytecode, written once: every rank of every run otherwise compiles its ~240
# modules from source (~1 s of CPU a process) where PYTHONDONTWRITEBYTECODE keeps Python from
# caching it. A module edited later is compiled anew (the cache records the source's mtime).
"$PY" -m compileall -q -j 0 nereus launchers >/dev/null

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  need=""
  for cmd in slurmctld slurmd sinfo munged h5clear hipcc g++; do
    command -v "$cmd" >/dev/null 2>&1 || need=1
  done
  if [ -n "$need" ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      slurmctld slurmd slurm-client munge hdf5-tools hipcc g++ >/dev/null
  fi
fi
echo "nereus: setup done"
