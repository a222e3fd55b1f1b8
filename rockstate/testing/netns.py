"""Hosts on one machine: network namespaces on a bridge, and links between them to cut and heal.

``Network()`` makes a bridge in the root namespace; each host (``add(name)``,
or ``place(name)`` for ``LocalCluster(hosts=...)``) is a network namespace
with a veth into that bridge and one address in a /24 of the network's own.
The bridge has an address too, so this process reaches every host, and a
process started with ``prefix(name)`` (``ip netns exec <namespace>``, which
execs: its PID is the process's) lives on that host.

``cut(a, b)`` drops every packet between two hosts, both ways (iptables DROP
in ``a``'s namespace), as a failed link would: nothing is refused, packets
vanish and connections time out. ``heal(a, b)`` takes the rules away, and the
connections that survived resume. ``enter(name)`` moves the calling thread
into a host's namespace (a network namespace is per thread): the sockets it
opens from then on are that host's, and are cut with it.

``close()`` stops every process left in the namespaces by its PID and deletes
the namespaces and the bridge, whatever happened before. Names carry this
process's PID; a new network removes those of processes that died without
closing theirs.
"""

from __future__ import annotations

import ctypes
import ipaddress
import itertools
import os
import re
import shutil
import signal
import subprocess
import threading
from dataclasses import dataclass

from ..errors import ConfigError

CLONE_NEWNET = 0x40000000
_OURS = re.compile(r"rs(\d+)[a-z](-|br$)")  # our namespaces ("rs<pid><letter>-<host>") and bridges ("rs<pid><letter>br")
_made = itertools.count()  # networks made by this process: each has names of its own (a deleted one's may linger)


@dataclass(frozen=True)
class Host:
    name: str
    namespace: str
    address: str


def _run(*args: str) -> str:
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode:
        raise ConfigError(f"`{' '.join(args)}` failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def refused() -> str | None:
    """Why this machine cannot make network namespaces (not root, a kernel or sandbox that refuses), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    name = f"rs{os.getpid()}-probe"
    done = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if done.returncode:
        return f"the kernel refused a network namespace: {done.stderr.strip()}"
    try:  # cuts are iptables rules inside a namespace: a kernel without netfilter refuses them
        rules = subprocess.run(["ip", "netns", "exec", name, "iptables", "-L", "-n"], capture_output=True, text=True)
    except FileNotFoundError:
        return "iptables is not installed: scripts/setup.sh installs it"
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    if rules.returncode:
        return f"the kernel refused iptables rules in a network namespace: {rules.stderr.strip()}"
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _stop_processes(namespace: str) -> None:
    """SIGKILL, by PID, every process (ours: started there) still in a namespace."""
    pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout.split()
    for pid in map(int, pids):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _remove_abandoned() -> None:
    """Namespaces and bridges of processes that died without closing their networks."""
    namespaces = [line.split()[0] for line in _run("ip", "netns", "list").splitlines() if line.strip()]
    bridges = [line.split(":")[1].strip().split("@")[0] for line in _run("ip", "-o", "link", "show", "type", "bridge").splitlines()]
    for name in namespaces + bridges:
        found = _OURS.match(name)
        if found and not _alive(int(found.group(1))):
            if name in namespaces:
                _stop_processes(name)
                subprocess.run(["ip", "netns", "del", name], capture_output=True)
            else:
                subprocess.run(["ip", "link", "del", name], capture_output=True)


def _free_subnet() -> ipaddress.IPv4Network:
    used = {ipaddress.ip_interface(word).network for line in _run("ip", "-4", "-o", "addr").splitlines()
            for word in line.split()[3:4]}
    for i in range(256):
        subnet = ipaddress.ip_network(f"10.213.{(os.getpid() + i) % 256}.0/24")
        if not any(subnet.overlaps(u) for u in used):
            return subnet
    raise ConfigError("no free /24 in 10.213.0.0/16 for a test network")


class Network:
    def __init__(self) -> None:
        for tool in ("ip", "iptables"):
            if not shutil.which(tool):
                raise ConfigError(f"`{tool}` is not installed: scripts/setup.sh installs iproute2 and iptables")
        _remove_abandoned()
        self.tag = f"rs{os.getpid()}{chr(ord('a') + next(_made) % 26)}"  # interface names: 15 characters at most
        self.bridge = f"{self.tag}br"
        self.hosts: dict[str, Host] = {}
        self._cuts: set[tuple[str, str]] = set()
        self.subnet = _free_subnet()
        self._addresses = iter(self.subnet.hosts())
        self.gateway = str(next(self._addresses))  # the bridge's: this process's address on the network
        try:
            _run("ip", "link", "add", self.bridge, "type", "bridge")
            _run("ip", "addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
            _run("ip", "link", "set", self.bridge, "up")
        except BaseException:
            self.close()
            raise

    def add(self, name: str) -> Host:
        """A new host: a namespace with an address on the bridge."""
        if name in self.hosts:
            raise ConfigError(f"host {name!r} exists already")
        namespace, veth = f"{self.tag}-{name}", f"{self.tag}h{len(self.hosts)}"
        host = Host(name, namespace, str(next(self._addresses)))
        _run("ip", "netns", "add", namespace)
        self.hosts[name] = host
        _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", namespace)
        _run("ip", "link", "set", veth, "master", self.bridge, "up")
        _run("ip", "-n", namespace, "addr", "add", f"{host.address}/{self.subnet.prefixlen}", "dev", "eth0")
        _run("ip", "-n", namespace, "link", "set", "eth0", "up")
        _run("ip", "-n", namespace, "link", "set", "lo", "up")
        return host

    def host(self, name: str) -> Host:
        return self.hosts.get(name) or self.add(name)

    def prefix(self, name: str) -> list[str]:
        """The command prefix that runs a program on host ``name``."""
        return ["ip", "netns", "exec", self.host(name).namespace]

    def place(self, name: str) -> tuple[str, list[str]]:
        """For ``LocalCluster(hosts=...)``: each process on a host of its own name, made when first asked for."""
        return self.host(name).address, self.prefix(name)

    # -- links ---------------------------------------------------------------------

    def _rules(self, action: str, a: str, b: str) -> None:
        peer = self.hosts[b].address
        for chain, side in (("INPUT", "-s"), ("OUTPUT", "-d")):
            _run(*self.prefix(a), "iptables", "-w", action, chain, side, peer, "-j", "DROP")

    def cut(self, a: str, b: str) -> None:
        """Every packet between hosts ``a`` and ``b`` is dropped from now on, both ways."""
        if (a, b) not in self._cuts and (b, a) not in self._cuts:
            self._rules("-I", a, b)
            self._cuts.add((a, b))

    def heal(self, a: str, b: str) -> None:
        for pair in ((a, b), (b, a)):
            if pair in self._cuts:
                self._rules("-D", *pair)
                self._cuts.discard(pair)

    def isolate(self, a: str, *others: str) -> None:
        """Cut ``a`` from each of ``others`` (this process, on the bridge, still reaches it)."""
        for b in others:
            self.cut(a, b)

    def heal_all(self) -> None:
        for a, b in list(self._cuts):
            self.heal(a, b)

    def enter(self, name: str) -> None:
        """Move the calling thread into host ``name``'s network namespace, for good (use a thread of its own)."""
        if threading.current_thread() is threading.main_thread():
            raise ConfigError("enter() moves the calling thread for good: call it from a thread of its own, not the main one")
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/var/run/netns/{self.hosts[name].namespace}", os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into {name}'s namespace failed")
        finally:
            os.close(fd)

    # -- life cycle ------------------------------------------------------------------

    def close(self) -> None:
        """Stop every process still in a host (by PID), delete every namespace and the bridge."""
        for host in self.hosts.values():
            _stop_processes(host.namespace)
            subprocess.run(["ip", "netns", "del", host.namespace], capture_output=True)
        self.hosts.clear()
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)

    def __enter__(self) -> "Network":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
