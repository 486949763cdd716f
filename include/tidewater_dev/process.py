"""A local server this project starts for the demo, tests and benchmarks (the embedded broker, a Spark Connect
server): its process, port and log, whether it is alive, how it stops, and its record in $TIDEWATER_HOME."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar, TypeVar

from tidewater.config.locations import home_dir
from tidewater.errors import TransientError

S = TypeVar("S", bound="LocalServer")


def wait_listening(port: int, timeout: float, host: str = "127.0.0.1") -> bool:
    """Whether something accepts connections on ``host:port`` within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def spawn(cmd: list[str], log_path: Path, env: dict[str, str], cwd: Path | None = None) -> subprocess.Popen:
    """A server's process in a session of its own (its stop signals the group where the class says so), its output
    appended to ``log_path``."""
    with open(log_path, "ab") as logf:
        return subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)


@dataclass
class LocalServer:
    pid: int
    port: int
    log_path: str

    # signal the whole process group (a server that starts children: the JVM's Python workers), not the pid alone
    process_group: ClassVar[bool] = False
    grace: ClassVar[float] = 2.0  # seconds between SIGTERM and SIGKILL

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except OSError:
            return False
        try:  # a zombie child counts as gone
            return Path(f"/proc/{self.pid}/stat").read_text().split()[2] != "Z"
        except OSError:
            return True

    def _signal(self, sig: int) -> None:
        try:
            (os.killpg if self.process_group else os.kill)(self.pid, sig)
        except OSError:
            pass

    def stop(self, grace: float | None = None) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds (the class's default when not given)."""
        if not self.alive():
            return
        self._signal(signal.SIGTERM)
        deadline = time.monotonic() + (self.grace if grace is None else grace)
        while time.monotonic() < deadline and self.alive():
            try:
                os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                pass
            time.sleep(0.05)
        if self.alive():
            self._signal(signal.SIGKILL)
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass

    def listening(self: S, proc: subprocess.Popen, what: str, timeout: float) -> S:
        """This server once its port accepts connections with ``proc`` still running; else it is stopped and a
        TransientError names ``what`` and the log."""
        if not wait_listening(self.port, timeout) or proc.poll() is not None:
            self.stop(grace=2)
            raise TransientError(f"{what} did not listen on 127.0.0.1:{self.port} within {timeout:.0f} s; see {self.log_path}")
        return self

    def record(self, state_file: str) -> None:
        """Remember this server in $TIDEWATER_HOME (for `stop` and `status` from another process)."""
        (home_dir() / state_file).write_text(json.dumps(asdict(self)))

    @classmethod
    def recorded(cls: type[S], state_file: str) -> S | None:
        path = home_dir() / state_file
        if not path.is_file():
            return None
        d = json.loads(path.read_text())
        return cls(int(d["pid"]), int(d["port"]), d["log_path"])

    @staticmethod
    def forget(state_file: str) -> None:
        (home_dir() / state_file).unlink(missing_ok=True)


def answers_http(url: str, seconds: float) -> bool:
    """Whether ``url`` answers 200 within ``seconds`` (asked every second or two until then)."""
    import urllib.request

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return True
        except OSError:
            time.sleep(1)
    return False
