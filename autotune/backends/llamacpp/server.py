"""llama.cpp's llama-server as a server under load: one process per trial, built by `make llama-tools` from
the source llama-cpp-python carries (the same library the offline trials load), started with the trial's
settings on a UNIX socket in the trial's folder (no port to collide with another trial's; a TCP port on
loopback where a client that speaks only TCP drives it, as an independent load generator), and driven over
its native streaming endpoint (`/completion`: token ids in, each chunk's token ids out, so the tokens can be
compared with the offline path's and no tokenizer runs in the load generator).

The process never outlives its trial (the context manager terminates it, then kills it), and a server that
dies mid-probe fails the probe with its last lines.
"""

from __future__ import annotations

import http.client
import json
import shlex
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.backends.llamacpp.own_tool import tool_path
from autotune.common.json_record import Record

SERVER_TOOL = "llama-server"
STARTUP_TIMEOUT_S = 120.0
LOG_TAIL_LINES = 15
UNNAMED = -1  # a streamed token whose id llama-server did not send (see LlamaServer.stream)
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class LlamaServerSettings(Record):
    """The llama-server flags the server scenario sets. slots 0: llama-server's own choice (`-np -1`: 4
    slots, one KV cache shared by all); context: the KV cache's tokens (`-c`), shared by the slots when
    unified, else divided among them."""

    slots: int = 0
    context: int = 4096
    batch: int = 2048  # -b: tokens one llama_decode call takes
    ubatch: int = 512  # -ub: tokens one compute batch takes
    flash_attn: str = "auto"
    cache_type: str = "f16"  # -ctk and -ctv
    threads: int = 1
    threads_batch: int = 0  # 0: as threads
    unified_kv: bool | None = None  # None: llama-server's own choice
    cache_reuse: int = 0
    continuous_batching: bool = True
    repack: bool = True  # llama.cpp's extra weight buffers (off: --no-repack, as a trial without them loads)

    def flags(self) -> list[str]:
        flags = ["-np", str(self.slots or -1), "-c", str(self.context), "-b", str(self.batch)]
        flags += ["-ub", str(self.ubatch), "-fa", self.flash_attn, "-ctk", self.cache_type, "-ctv", self.cache_type]
        flags += ["-t", str(self.threads), "-tb", str(self.threads_batch or self.threads)]
        if self.unified_kv is not None:
            flags.append("-kvu" if self.unified_kv else "-no-kvu")
        if self.cache_reuse:
            flags += ["--cache-reuse", str(self.cache_reuse)]
        if not self.continuous_batching:
            flags.append("-nocb")
        if not self.repack:
            flags.append("--no-repack")
        return flags


def _die_with_parent() -> None:
    """In the server's process before it starts: SIGTERM when the process that started it dies, so a killed
    search or benchmark leaves no server behind (Linux's PR_SET_PDEATHSIG)."""
    import ctypes
    import signal

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


class UnixConnection(http.client.HTTPConnection):
    """HTTP over a UNIX socket (llama-server listens on one when its --host is a path)."""

    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(str(self.path))


class LlamaServer:
    """A running llama-server on a GGUF (a context manager), as llm_server_loop's StreamingServer."""

    def __init__(
        self,
        gguf: Path,
        settings: LlamaServerSettings,
        folder: Path,
        pin: list[str] | None = None,
        binary: Path | None = None,
        port: int | None = None,
    ) -> None:
        self.binary = binary or tool_path(name=SERVER_TOOL)
        self.socket = folder / "llama-server.sock"
        self.port = port  # None: the UNIX socket
        self.log = folder / "llama-server.log"
        listen = ["--host", str(self.socket)] if port is None else ["--host", LOOPBACK, "--port", str(port)]
        self.command = [*(pin or []), str(self.binary), "-m", str(gguf), *listen, "--no-webui", *settings.flags()]
        self.settings = settings
        self.process: subprocess.Popen[bytes] | None = None
        self._open: set[http.client.HTTPConnection] = set()
        self._lock = threading.Lock()

    def __enter__(self) -> LlamaServer:
        self.socket.unlink(missing_ok=True)
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent
            )
        try:
            deadline = time.monotonic() + STARTUP_TIMEOUT_S
            while not self._healthy():
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"llama-server exited {self.process.returncode} while starting: {self.last_lines()}"
                    )
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"llama-server was not ready within {STARTUP_TIMEOUT_S:.0f}s: {self.last_lines()}"
                    )
                time.sleep(0.05)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Terminate the server, then kill it if it has not exited within 10 s."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def last_lines(self) -> str:
        """The server log's last lines (what it said before it died), joined."""
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return "no log"
        kept = [line for line in lines if line.strip() and not line.startswith("#")][-LOG_TAIL_LINES:]
        return " | ".join(kept) or "no output"

    def described(self) -> str:
        return shlex.join(self.command)

    @property
    def url(self) -> str | None:
        """The server's base URL on loopback, for an HTTP client of its own (None: it listens on the socket)."""
        return None if self.port is None else f"http://{LOOPBACK}:{self.port}"

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self.port is None:
            return UnixConnection(self.socket, timeout)
        return http.client.HTTPConnection(LOOPBACK, self.port, timeout=timeout)

    def _healthy(self) -> bool:
        if self.port is None and not self.socket.exists():
            return False
        connection = self._connection(timeout=2.0)
        try:
            connection.request("GET", "/health")
            return connection.getresponse().status == 200
        except OSError:
            return False
        finally:
            connection.close()

    def _died(self, wait_s: float = 0.0) -> RuntimeError | None:
        """The server's death as an error, waiting up to `wait_s` for a dying process to be reaped."""
        if self.process is None:
            return None
        try:
            self.process.wait(wait_s)
        except subprocess.TimeoutExpired:
            return None
        return RuntimeError(f"llama-server died (exit {self.process.returncode}): {self.last_lines()}")

    def cancel_all(self) -> None:
        """Shut every open request's connection: its read returns, and llama-server drops the request."""
        with self._lock:
            connections = list(self._open)
        for connection in connections:
            if connection.sock is not None:
                try:
                    connection.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # already closed

    def settle(self, timeout_s: float = 30.0) -> None:
        """Wait until no slot is processing a request (llama-server's /slots)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            connection = self._connection(timeout=5.0)
            try:
                connection.request("GET", "/slots")
                slots = json.loads(connection.getresponse().read())
            except (OSError, http.client.HTTPException, ValueError):
                slots = None
            finally:
                connection.close()
            if isinstance(slots, list) and not any(slot.get("is_processing") for slot in slots):
                return
            if died := self._died():
                raise died
            time.sleep(0.05)
        raise RuntimeError(f"llama-server still processed requests {timeout_s:.0f}s after they were cancelled")

    def stream(
        self,
        prompt: Any,
        max_new_tokens: int,
        on_tokens: Any,
        cancelled: threading.Event,
    ) -> None:
        """One request, greedy, exactly `max_new_tokens` tokens (ignore_eos), no prompt cache reuse between
        requests; each streamed chunk's token ids handed to `on_tokens` as it is read. llama-server holds back
        the tokens of a UTF-8 character split over several (byte tokens) and names only the last one when it
        sends them: the others come as UNNAMED, so every token is counted and stamped."""
        body = {
            "prompt": [int(t) for t in prompt],
            "n_predict": max_new_tokens,
            "stream": True,
            "ignore_eos": True,
            "temperature": 0.0,
            "top_k": 1,
            "cache_prompt": False,
            "return_tokens": True,
            "samplers": ["top_k"],
        }
        connection = self._connection(timeout=600.0)
        with self._lock:
            self._open.add(connection)
        seen = 0
        stopped = False
        try:
            connection.request("POST", "/completion", json.dumps(body), {"Content-Type": "application/json"})
            response = connection.getresponse()
            if response.status != 200:
                raise RuntimeError(f"llama-server answered {response.status}: {response.read()[:300]!r}")
            while not cancelled.is_set():
                line = response.readline()
                if not line:
                    break
                if not line.startswith(b"data: "):
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise RuntimeError(f"llama-server refused the request: {json.dumps(chunk['error'])[:300]}")
                ids = [int(t) for t in chunk.get("tokens") or []]
                # a chunk that completes a UTF-8 character held back over several tokens names only its
                # last token: the others are counted (tokens_predicted) and named UNNAMED
                count = int(chunk.get("tokens_predicted", seen + len(ids))) - seen
                if count > 0:
                    on_tokens([UNNAMED] * (count - len(ids)) + ids[-count:])
                    seen += count
                if chunk.get("stop"):
                    stopped = True
                    break
        except (OSError, http.client.HTTPException) as error:
            if cancelled.is_set():
                return  # shut by cancel_all
            raise self._died(1.0) or RuntimeError(f"llama-server's stream broke: {error}") from error
        finally:
            with self._lock:
                self._open.discard(connection)
            connection.close()
        if not stopped and not cancelled.is_set():
            raise self._died(1.0) or RuntimeError("llama-server's stream ended before its last token")
