"""Probe ops for benchmarks/fusion_probe/fusion_probe.py: can a custom op
outside MAX's tree take MAX's elementwise producers as a fused input?"""
