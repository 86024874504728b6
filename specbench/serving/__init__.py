"""Speculation under load: real servers per strategy, load shapes, an async streaming client, per-request
timings, the servers' own speculative counters, and the figures against plain decoding at each load."""
