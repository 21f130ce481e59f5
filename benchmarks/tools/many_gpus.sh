#!/usr/bin/env bash
# The many-GPU checks and benches of issues 35 and 39, on one host with N GPUs.
#
#   benchmarks/tools/many_gpus.sh prepare   # build the kernel library and the launch extension once
#   benchmarks/tools/many_gpus.sh tests     # NCCL vocab-parallel tests (2..N ranks), MAX sharded ops
#                                           # with real collectives, every-device tests, at once
#   benchmarks/tools/many_gpus.sh bench     # parallel_bench.py: torch at 2 and N ranks, MAX at 2 and N
#
# Logs and JSON go to $OUT (default ./many_gpus_out). NVLink multicast stays off (a program that
# uses it can take a shared host's GPUs out of service): the three variables below are exported
# for every program this starts. Tests share the GPUs, so MAX's memory pool is capped per process.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export MAX_SOFTMAX_QUIET=1
OUT=${OUT:-many_gpus_out}
mkdir -p "$OUT"
GPUS=$(python -c "import torch; print(torch.cuda.device_count())")
echo "GPUs: $GPUS"

case "${1:-}" in
prepare)
  MAX_SOFTMAX_LAUNCH=extension python - <<'PY'
import time
t = time.time()
from max_softmax import kernels, launch
kernels.kernel_library()
print(f"kernel library: {time.time() - t:.0f} s", flush=True)
launch.extension()
print(f"launch extension (with {launch.target_accelerator()}): {time.time() - t:.0f} s")
PY
  ;;
tests)
  export MODULAR_DEVICE_CONTEXT_MEMORY_MANAGER_SIZE_PERCENT=${POOL:-8}
  timeout -s INT -k 30 "${LIMIT:-500}" python -m pytest -v -rfE --tb=short --nccl tests/test_parallel.py \
    > "$OUT/test_parallel_nccl.log" 2>&1 &
  timeout -s INT -k 30 "${LIMIT:-500}" python -m pytest -v -rfE --tb=short tests/test_sharded.py -k gpus \
    > "$OUT/test_sharded_gpus.log" 2>&1 &
  timeout -s INT -k 30 "${LIMIT:-500}" python -m pytest -v -rfE --tb=short -n 4 tests/test_devices.py \
    > "$OUT/test_devices.log" 2>&1 &
  if [ -n "${EXTRA_TESTS:-}" ]; then
    # shellcheck disable=SC2086
    timeout -s INT -k 30 "${LIMIT:-500}" python -m pytest -v -rfE --tb=short -n "${EXTRA_N:-8}" -k "${EXTRA_K:-gpu or cuda}" $EXTRA_TESTS \
      > "$OUT/extra_tests.log" 2>&1 &
  fi
  wait
  tail -n 15 "$OUT"/*.log
  ;;
bench)
  for world in $(echo "${WORLDS:-2 $GPUS}" | tr ' ' '\n' | sort -un); do
    CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((world - 1))) timeout "${LIMIT:-300}" \
      torchrun --nproc-per-node "$world" benchmarks/tools/parallel_bench.py torch \
      --out "$OUT/torch_w$world.json" ${TORCH_ARGS:-} 2>&1 | grep -v '^W' | tail -n 40
  done
  for world in ${MAX_WORLDS:-}; do
    timeout "${LIMIT:-300}" python benchmarks/tools/parallel_bench.py max --gpus "$world" \
      --out "$OUT/max_g$world.json" ${MAX_ARGS:-} 2>&1 | tail -n 20
  done
  ;;
*)
  echo "usage: $0 prepare|tests|bench" >&2
  exit 2
  ;;
esac
