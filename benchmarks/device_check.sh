#!/usr/bin/env bash
# Device check of the GPU data plane (issue 19) on one GPU, in one go (<= 8 minutes on one H200
# with 16 CPU cores; no network, nothing installed from outside the machine):
#   (a) pack kernels: nereus._kernels built (sm_90 unless TORCH_CUDA_ARCH_LIST says otherwise),
#       random slices checked byte for byte with poisoned outputs, bandwidth against a device
#       copy of the same bytes (goal >= 0.90 on the layer and embedding plans);
#   (b) nereus run of examples/grpo-tiny-gpu.yaml: 1 rank on the GPU (generation, training,
#       weight sync, the allocator's peaks, an induced out-of-memory error turned into an urgent
#       replan with the step redone) and 4 ranks sharing the GPU over the host transport with
#       forced transitions on CUDA tensors; a Destroyed unit's memory back to the device;
#   (c) one training step on CUDA against the same step on CPU (fp32, TF32 off; tolerance in
#       benchmarks/device_check.py) and the bf16 step reported.
# Writes $OUT/device_check.json (the summary) and $OUT/device_check.log ($OUT: the device
# tool's folder, else out/device_check).
#
# What to carry (the H200 image has torch with CUDA and NCCL, mpi4py on Open MPI 4.1, h5py; no
# megatron-core, maybe no PyYAML, no transformers): the wheels in .carry/wheels, e.g.
#   pip download megatron-core==0.16.1 pyyaml packaging transformers tokenizers huggingface_hub \
#       safetensors regex tqdm typing-extensions httpx2 httpcore2 h11 idna filelock truststore \
#       --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
#       --platform manylinux2014_x86_64 -d .carry/wheels     (23 MB, checked to resolve)
# and run with carry=[".carry"]; they are installed from there with --no-index (a few MB). The
# dry run lists what is missing. Without Open MPI 5 (ULFM) the rank program runs under the
# image's mpiexec directly (what nereus run starts after its checks).
#
#   bash benchmarks/device_check.sh            # on the GPU machine
#   bash benchmarks/device_check.sh --dry-run  # anywhere: prerequisites, every part on the CPU
# Exit status: 0 all passed, 1 a part failed, 2 prerequisites missing.
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=""
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY="--dry-run" ;;
    *) echo "usage: $0 [--dry-run]" >&2; exit 2 ;;
  esac
done
RES=${OUT:-out/device_check}
mkdir -p "$RES"
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONWARNINGS=ignore
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# Carried wheels (megatron-core): installed offline into a folder of this tree, once.
if ! "$PY" -c "import megatron.core, yaml, packaging, transformers" 2>/dev/null; then
  if ls .carry/wheels/*.whl >/dev/null 2>&1; then
    mkdir -p .carry/site
    "$PY" -m pip install --no-index --no-deps --quiet --target .carry/site .carry/wheels/*.whl \
      || echo "installing the carried wheels failed" >&2
    export PYTHONPATH="$PYTHONPATH:$PWD/.carry/site"
  fi
fi

if ! "$PY" -c "import torch, numpy" 2>/dev/null; then
  echo "needs python3 with torch and numpy" >&2
  exit 2
fi
if [ -z "$DRY" ] && ! "$PY" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  echo "no CUDA device visible to torch: run with --dry-run here" >&2
  exit 2
fi
# 7.5 minutes for the whole check; what finished is still in the summary.
timeout 450 "$PY" benchmarks/device_check.py --out "$RES" $DRY
rc=$?
if [ "$rc" = 124 ]; then
  echo "device check: out of time (450 s)" >&2
fi
exit "$rc"
