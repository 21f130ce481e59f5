#!/usr/bin/env bash
# One sitting on the lent H100 (see README "GPU"): MAX must already be
# installed under $HOME/site by ../shared/gpu/prepare's install step.
#   bash benchmarks/tools/gpu_session.sh test [pytest args]   # GPU + CPU test suite
#   bash benchmarks/tools/gpu_session.sh fuzz                 # scripts/fuzz, GPU cases
#   bash benchmarks/tools/gpu_session.sh report               # the softmax command on the GPU
#   bash benchmarks/tools/gpu_session.sh bench [bench args...]  # tables to $OUT, rows appended
#                                                      # to $OUT/results.jsonl (--record)
#   bash benchmarks/tools/gpu_session.sh bench-each SHAPES [bench args...]  # one process per shape
#                                                      # (MAX keeps its device memory pool, so a
#                                                      # GB-sized shape after others runs out)
#   bash benchmarks/tools/gpu_session.sh ncu [--op OP] [--provider ours|quack] DTYPE ROWS N [VARIANT]
#                                                      # Nsight Compute counters (quack: QuACK on
#                                                      # PYTHONPATH, ../shared/gpu/prepare-peers)
#   bash benchmarks/tools/gpu_session.sh sweep [once|long|cluster|smem]  # split_stream block shapes,
#                                                      # on-chip rows a block or a cluster (A/B)
#   bash benchmarks/tools/gpu_session.sh ncu-source [SKIP]    # per-SASS-instruction counters of a split
#                                                      # stream kernel of `sweep once` (SKIP: which
#                                                      # launch): executions, stall samples by
#                                                      # reason, excessive sectors, as CSV
#   bash benchmarks/tools/gpu_session.sh compile OLD_OP_DIR   # cold compile of an auto model: OLD_OP_DIR
#                                                       # (an older op/, carried) vs op/, alternating
# `sweep` runs ./split_stream_sweep, built on the machine without a GPU
# (`mojo build -I . --target-accelerator sm_90 benchmarks/tools/split_stream_sweep.mojo
# -o split_stream_sweep`, git-ignored) and sent along with `carry`.
# Logs and results go to $OUT (the device tool brings them back); TAG names
# the log files of a stage run more than once.
set -uo pipefail
export PYTHONPATH=$HOME/site:$PWD/python${PYTHONPATH:+:$PYTHONPATH} PATH=$HOME/site/bin:$PATH PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
stage=${1:-test}; shift || true
log="$OUT/${stage}${TAG:+_$TAG}.log"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
case "$stage" in
  test)   # The launch extension first, once: else each pytest worker builds its own
          # (numpy and torch calls would race to build it, 1-2 min each with a GPU target).
          python3 -c "from max_softmax import launch; launch.extension()" 2>&1 | tee "$log"
          # Device-graph captures in several processes on one GPU at once fail
          # (preBackForCapture: CUDA_ERROR_OUT_OF_MEMORY, H100 2026-11-26), so the
          # replay tests run after, in one process.
          python3 -m pytest -q -n 8 -p no:cacheprovider --ignore=tests/test_replay.py "$@" 2>&1 \
            | tee -a "$log" | tail -40
          python3 -m pytest -q -p no:cacheprovider -p no:xdist tests/test_replay.py 2>&1 \
            | tee -a "$log" | tail -5 ;;
  fuzz)   python3 -m pytest -q -n 4 -p no:cacheprovider tests/test_fuzz.py -k gpu \
            --fuzz-examples 2000 "$@" 2>&1 | tee "$log" | tail -20 ;;
  report) python3 -m max_softmax "$@" 2>&1 | tee "$log"
          python3 -m max_softmax --dtype bfloat16 2>&1 | tee -a "$log" ;;
  ncu)    /usr/local/cuda/bin/ncu --target-processes all --launch-skip 1 \
            --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
            --section Occupancy --section SchedulerStats --section WarpStateStats \
            --section LaunchStats python3 benchmarks/tools/ncu_profile.py "$@" 2>&1 | tee "$log" ;;
  bench)  python3 -m max_softmax bench --out "$OUT" --record "$OUT/results.jsonl" "$@" 2>&1 \
            | tee "$log" | grep -v "^bench:" ;;
  bench-each) shapes=$1; shift
          # One small run first compiles every provider's graphs (MAX caches them on
          # disk): a GB-sized shape's process then spends its time timing, and a
          # timeout cannot keep killing the same compile shape after shape.
          python3 -m max_softmax bench --shape 256x256 --reps 1 --out "$OUT/warm" "$@" \
            > "$OUT/warm.log" 2>&1
          for s in ${shapes//,/ }; do
            python3 -m max_softmax bench --shape "$s" --tag "$s" --out "$OUT" \
              --record "$OUT/results.jsonl" "$@" 2>&1 | grep -v "^bench:"
          done | tee "$log" ;;
  compile) for i in 1 2; do
            for tree in "$1" op; do
              python3 benchmarks/tools/compile_time.py --kernels "$tree" --device gpu --label "$tree"
            done
          done 2>&1 | tee "$log" ;;
  sweep)  LD_LIBRARY_PATH=$HOME/site/modular/lib:${LD_LIBRARY_PATH:-} ./split_stream_sweep "$@" \
            2>&1 | tee "$log" ;;
  ncu-source)  # the report, then its source page: one row a SASS instruction
          LD_LIBRARY_PATH=$HOME/site/modular/lib:${LD_LIBRARY_PATH:-} /usr/local/cuda/bin/ncu \
            --kernel-name regex:split_stream --launch-skip "${1:-1}" --launch-count 1 --set full \
            -f -o "$OUT/split_stream" ./split_stream_sweep once > "$log" 2>&1
          /usr/local/cuda/bin/ncu --import "$OUT/split_stream.ncu-rep" --page source --csv \
            --print-source sass > "$OUT/split_stream_sass.csv" 2>> "$log"
          /usr/local/cuda/bin/ncu --import "$OUT/split_stream.ncu-rep" --page details \
            --print-details all > "$OUT/split_stream_details.txt" 2>> "$log"
          grep -E "Duration|DRAM Throughput|Issue Slots Busy" "$OUT/split_stream_details.txt" | head -4 ;;
esac
