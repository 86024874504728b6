"""Stops a server's process group once specbench is gone, however it went (SIGKILL and OOM kills included).

Run as `python -m specbench.serving.watchdog GROUP GRACE_S` with its stdin the read end of a pipe whose only
write end specbench holds. The kernel closes that end when specbench exits for any reason, and the read
returns; the group then gets SIGTERM, and SIGKILL after the grace period. A parent-death signal
(prctl PR_SET_PDEATHSIG) would reach the API server process alone, not the engine core it started.
"""

from __future__ import annotations

import os
import signal
import sys
import time


def group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def stop_group(group: int, grace_s: float) -> None:
    """SIGTERM to the group, SIGKILL to what is left after `grace_s` seconds."""
    try:
        os.killpg(group, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and group_alive(group):
        time.sleep(0.2)
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main() -> None:
    group, grace_s = int(sys.argv[1]), float(sys.argv[2])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for specbench is specbench's to handle
    sys.stdin.buffer.read()  # returns at end of file: specbench closed the pipe, or is gone
    stop_group(group, grace_s)


if __name__ == "__main__":
    main()
