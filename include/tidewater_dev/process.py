"""A local server this project starts for the demo, tests and benchmarks (the embedded broker, a Spark Connect
server): its process, port and log, whether it is alive, how it stops, and its record in $TIDEWATER_HOME."""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar, TypeVar

from tidewater.config.spec import home_dir

S = TypeVar("S", bound="LocalServer")


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
