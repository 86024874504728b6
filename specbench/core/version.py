"""The installed specbench's version, which every run directory and `specbench --version` give."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("specbench")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+local"
