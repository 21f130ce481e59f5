#!/usr/bin/env bash
# One sitting on the lent H100 (see README "GPU"): MAX must already be
# installed under $HOME/site by ../shared/gpu/prepare's install step.
#   bash benchmarks/gpu_session.sh test     # GPU + CPU test suite
#   bash benchmarks/gpu_session.sh report   # the softmax command on the GPU
#   bash benchmarks/gpu_session.sh bench [bench args...]
# Logs and results go to $OUT (the device tool brings them back).
set -uo pipefail
export PYTHONPATH=$HOME/site:$PWD/python PATH=$HOME/site/bin:$PATH PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
stage=${1:-test}; shift || true
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
case "$stage" in
  test)   python3 -m pytest -q -n 8 -p no:cacheprovider "$@" 2>&1 | tee "$OUT/pytest.log" | tail -40 ;;
  report) python3 -m max_softmax "$@" 2>&1 | tee "$OUT/report.log"
          python3 -m max_softmax --dtype bfloat16 2>&1 | tee -a "$OUT/report.log" ;;
  bench)  python3 -m max_softmax bench --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log" | grep -v "^bench:" ;;
esac
