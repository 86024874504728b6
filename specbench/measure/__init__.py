"""Measurement: NVML and host samplers, the speculative-decoding cost model."""
