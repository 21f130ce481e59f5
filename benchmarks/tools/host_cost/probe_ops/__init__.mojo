"""Probe ops for benchmarks/tools/host_cost/host_cost.py: what MAX's custom-op
call costs on the host before any softmax work (see that script)."""
