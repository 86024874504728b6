"""Measurement: NVML and host samplers, statistics, noise, the speculative-decoding cost model, and the GPU
profiles runs are projected onto (hardware.py)."""
