"""The benchmark run: prepare (load and check), decode, measure and summarise every strategy against `ar`."""

from specbench.bench.pipeline import run_benchmark

__all__ = ["run_benchmark"]
