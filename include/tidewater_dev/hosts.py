"""Test hosts on one machine: Linux network namespaces on a bridge, each with its own hostname and its own view of the
disk, so that processes started "on" one (Airflow's Celery workers) share nothing with the machine's own processes
but the network, as workers on separate hosts.

- The network: a bridge ``tw<n>br`` with the address 10.231.<n>.1/24 (:attr:`Network.gateway`). Servers the hosts use
  listen there (PostgreSQL, Kafka, Redis, the S3 endpoint, Airflow's api-server); the machine reaches it as well.
- A host: a network namespace ``tw<n>h<k>`` with a veth on the bridge (10.231.<n>.<k+1>) and its loopback. Each
  command runs there in a new mount and UTS namespace: the hostname is the host's name (Airflow records it on each
  task try), and ``/tmp``, ``$HOME``, the system temporary folder and the repository's ``.data/`` are folders of
  the host's own (under :attr:`Host.disk`, kept after a kill, as a disk is). The repository itself (code, virtualenv)
  stays visible: each host has the software installed, as a deployed worker has.
- :meth:`Host.kill` is a host lost: SIGKILL to every process in its namespace at once.

Needs root (``ip netns``, ``mount``); :func:`unavailable` says why not where it cannot run. Why not containers: no
container runtime runs here, and namespaces are what a container is made of.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")


def unavailable() -> str | None:
    """Why test hosts cannot be made here (not root, no ``ip`` or ``unshare``), or None."""
    if os.geteuid() != 0:
        return "network namespaces and mounts need root"
    for tool in ("ip", "unshare", "mount"):
        if subprocess.run(["which", tool], capture_output=True).returncode != 0:
            return f"{tool} is not installed"
    return None


@dataclass
class Network:
    """A bridge for test hosts; ``index`` (1-250) picks its subnet and names, so two runs can coexist."""

    index: int

    @property
    def bridge(self) -> str:
        return f"tw{self.index}br"

    @property
    def gateway(self) -> str:
        """The machine's own address on the bridge: where the servers the hosts use listen."""
        return f"10.231.{self.index}.1"

    @property
    def cidr(self) -> str:
        return f"10.231.{self.index}.0/24"

    def create(self) -> Network:
        self.remove()  # what a killed run left
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        return self

    def remove(self) -> None:
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)

    def host(self, number: int, disk: Path) -> Host:
        """Host ``number`` (1-250) on this bridge, its own files under ``disk``; made and connected."""
        return Host(self, number, disk).create()


@dataclass
class Host:
    network: Network
    number: int
    disk: Path  # the host's own folders (tmp, home, data, ...), as its disk

    @property
    def name(self) -> str:
        """Its network namespace's name and its hostname."""
        return f"tw{self.network.index}h{self.number}"

    @property
    def address(self) -> str:
        return f"10.231.{self.network.index}.{self.number + 1}"

    @property
    def home(self) -> Path:
        """Its home folder as the machine sees it (the host sees it as ``$HOME``)."""
        return self.disk / "home"

    def create(self) -> Host:
        if self.disk.resolve().is_relative_to(REPO / ".data"):
            raise ValueError(f"{self.disk}: a host's disk cannot lie in {REPO / '.data'}, which each host replaces")
        self.remove()
        veth = f"{self.name}v"
        _ip("netns", "add", self.name)
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", self.name)
        _ip("link", "set", veth, "master", self.network.bridge, "up")
        _ip("-n", self.name, "addr", "add", f"{self.address}/24", "dev", "eth0")
        _ip("-n", self.name, "link", "set", "eth0", "up")
        _ip("-n", self.name, "link", "set", "lo", "up")
        for folder in ("tmp", "home", "data", "systmp"):
            (self.disk / folder).mkdir(parents=True, exist_ok=True)
        os.chmod(self.disk / "tmp", 0o1777)
        return self

    def remove(self) -> None:
        self.kill()
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)
        subprocess.run(["ip", "link", "del", f"{self.name}v"], capture_output=True)

    def pids(self) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", self.name], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def kill(self) -> int:
        """The host lost: SIGKILL to every process in its namespace (repeated until none is left, as a process may
        be forking); returns how many were killed."""
        killed = 0
        for _ in range(20):
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
        return killed

    def popen(self, command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
        """Start ``command`` on this host (module docstring: its namespaces and folders), its output to ``log`` (a
        file of the machine's)."""
        script = self._setup_script() + ' exec "$@"'
        argv = [
            "ip",
            "netns",
            "exec",
            self.name,
            "unshare",
            "--mount",
            "--uts",
            "--propagation",
            "private",
            "--",
            "/bin/sh",
            "-c",
            script,
            "host",
            *command,
        ]
        with open(log, "ab") as out:
            return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def _setup_script(self) -> str:
        """The shell lines that give a new mount namespace the host's view: its hostname; the repository's ``.data``
        replaced by its own; each hidden folder (``/tmp``, ``$HOME``, the system temporary folder) replaced by its
        own, with the repository and Python bound back in where they lie under one."""
        q = shlex.quote
        lines = ["set -e", f"hostname {q(self.name)}", f"mount --bind {q(str(self.disk / 'data'))} {q(str(REPO / '.data'))}"]
        hidden = {"tmp": Path("/tmp"), "home": Path(os.path.expanduser("~")).resolve(), "systmp": Path(tempfile.gettempdir()).resolve()}
        keep = {REPO, Path(sys.base_prefix).resolve()}
        done: set[Path] = set()
        # the folder that holds the host's own disk goes last: once it is replaced, the disk's path leads elsewhere
        for label, folder in sorted(hidden.items(), key=lambda item: self.disk.resolve().is_relative_to(item[1])):
            if folder in done or any(folder.is_relative_to(d) for d in done) or folder == Path("/"):
                continue
            done.add(folder)
            own = self.disk / label
            for kept in sorted(keep):
                if kept.is_relative_to(folder):
                    inside = own / kept.relative_to(folder)
                    lines.append(f"mkdir -p {q(str(inside))} && mount --rbind {q(str(kept))} {q(str(inside))}")
            lines.append(f"mount --rbind {q(str(own))} {q(str(folder))}")
        return "; ".join(lines) + ";"


def free_index() -> int:
    """A bridge index no other run on this machine uses now."""
    taken = subprocess.run(["ip", "-o", "link", "show", "type", "bridge"], capture_output=True, text=True).stdout
    for index in range(20 + os.getpid() % 200, 251):
        if f"tw{index}br" not in taken:
            return index
    for index in range(1, 251):
        if f"tw{index}br" not in taken:
            return index
    raise RuntimeError("no free test network: 250 tw<n>br bridges exist")
