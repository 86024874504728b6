"""specbench: benchmark and autotune lossless speculative-decoding strategies."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("specbench")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+local"
