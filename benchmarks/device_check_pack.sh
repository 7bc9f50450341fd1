#!/usr/bin/env bash
# Device check of the shard pack/unpack kernels on one NVIDIA GPU (issue 8), in one go:
#   1. builds nereus._kernels in place (sm_90 unless TORCH_CUDA_ARCH_LIST says otherwise),
#   2. runs tests/gpu/test_kernels_gpu.py (random slices, poisoned outputs, every byte against torch;
#      with pytest when the image has it, else its plain runner) and fails if anything skipped,
#   3. runs benchmarks/pack.py --json with four tile sizes (16-128 kB),
#   4. writes summary.txt: per plan and op the best kernel tile's share of the copy bandwidth,
#      PASS when >= 0.90 for the layer and embedding plans (the norms plan is launch-bound and
#      is reported against torch's per-slice copies instead).
# Needs no network. Results go to $OUT (the device tool's folder) or out/device_check_pack.
# Exit status: 0 all passed, 1 build or correctness failed, 3 bandwidth target missed.
set -euo pipefail
cd "$(dirname "$0")/.."
RES=${OUT:-out/device_check_pack}
mkdir -p "$RES"
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
export NEREUS_BUILD_KERNELS=1
export MAX_JOBS=${MAX_JOBS:-8}

{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
  command -v nvcc >/dev/null && nvcc --version | tail -n 2
} >"$RES/env.txt" 2>&1 || true
cat "$RES/env.txt"

echo "== build"
start=$(date +%s)
if ! "$PY" setup.py build_ext --inplace >"$RES/build.log" 2>&1; then
  tail -n 40 "$RES/build.log"
  echo "build failed (log: $RES/build.log)"
  exit 1
fi
"$PY" -c "import nereus._kernels as k; print('built nereus._kernels:', k.DIALECT, 'layout', k.LAYOUT_VERSION)" \
  | tee -a "$RES/build.log"
echo "build took $(( $(date +%s) - start )) s" | tee -a "$RES/build.log"

echo "== correctness"
set +e
if "$PY" -c "import pytest" 2>/dev/null; then
  "$PY" -m pytest -q -rs -p no:cacheprovider tests/gpu/test_kernels_gpu.py >"$RES/gpu_test.log" 2>&1
else
  "$PY" tests/gpu/test_kernels_gpu.py >"$RES/gpu_test.log" 2>&1
fi
rc=$?
set -e
tail -n 15 "$RES/gpu_test.log"
if [ "$rc" != 0 ] || grep -qiE "[0-9]+ skipped|^SKIP" "$RES/gpu_test.log"; then
  echo "correctness failed or skipped (log: $RES/gpu_test.log)"
  exit 1
fi

echo "== benchmark"
"$PY" benchmarks/pack.py --json --tile-bytes 16384,32768,65536,131072 >"$RES/pack_bench.json"

"$PY" - "$RES/pack_bench.json" "$RES/summary.txt" <<'EOF'
import json
import sys

rows = json.load(open(sys.argv[1]))
lines, ok = [f"device: {rows[0]['device']}"], True
for plan in dict.fromkeys(r["plan"] for r in rows):
    for op in ("pack", "unpack"):
        rs = [r for r in rows if r["plan"] == plan and r["op"] == op]
        copy = next(r for r in rs if r["method"] == "copy")
        torch_row = next(r for r in rs if r["method"] == "torch")
        kernel_rows = [r for r in rs if r["method"].startswith("kernels")]
        if not kernel_rows:
            lines.append(f"{plan:18} {op:7} FAIL: no kernel rows (extension not used)")
            ok = False
            continue
        best = max(kernel_rows, key=lambda r: r["vs_copy"])
        verdict = ""
        if plan != "norms-65":
            passed = best["vs_copy"] >= 0.90
            ok &= passed
            verdict = "PASS" if passed else "FAIL (< 0.90 of copy)"
        lines.append(
            f"{plan:18} {op:7} copy {copy['gbps']:7.1f} GB/s | torch {torch_row['gbps']:7.1f} GB/s "
            f"({torch_row['vs_copy']:.2f} of copy) | {best['method']} {best['gbps']:7.1f} GB/s "
            f"({best['vs_copy']:.2f} of copy, {best['vs_torch']:.2f}x torch) {verdict}"
        )
open(sys.argv[2], "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
sys.exit(0 if ok else 3)
EOF
