"""Benchmark scenarios and the throttled multi-drive rig they run on."""
