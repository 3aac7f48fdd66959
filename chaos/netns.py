"""A private network of Linux network namespaces for the chaos suite and the tests that cut links
between brokers and ZooKeeper servers.

Layout (one :class:`Network`, every name carrying its random ``tag``)::

    root namespace                              namespace hpb-<tag>-<host>
    bridge hpb<tag>br  10.A.B.1/24  ---[veth hpb<tag>v<i> | eth0]---  10.A.B.(10+i)/24, lo up

The test process and anything it starts normally (ZooKeeper, clients) live in the root namespace
and reach every host through the bridge; a process started with :meth:`Host.argv` runs inside
its host's namespace, and may bind only that host's address (and its own loopback).  The subnet
10.A.B.0/24 is chosen at random among those no route or address of the root namespace touches,
so nothing here is reachable from, or listens on, an external interface.

:meth:`Network.cut` takes the root side of a host's veth down: the host can then reach nothing
outside its namespace (neither the bridge's address nor the other hosts), while what runs inside
it still reaches the host's own address.  :meth:`Network.heal` brings it back.

:meth:`Network.split` partitions the hosts into groups (Jepsen's majority/minority split): inside
each host's namespace an nftables table (``inet hpbchaos``, loaded with ``ip netns exec NS nft``)
drops every packet to and from the address of every host of another group, so no packet passes
between groups in either direction and, as with Jepsen's iptables DROP, a connection attempt
across the split hangs until its own timeout instead of failing at once (a blackhole route
would refuse it instantly with EINVAL, a gentler fault).  Every host still reaches the bridge's
address, and the root namespace reaches every host (as Jepsen's clients do).  Hosts named in no
group keep full connectivity.  :meth:`Network.join` deletes those tables (idempotent).

:func:`unavailable` says why namespaces cannot be made here (not root, no ``ip``, refused), or
None.  :meth:`Network.close` removes every namespace, veth and bridge this network made, and
only those, and is safe to call after a partial set-up.
"""

from __future__ import annotations

import ipaddress
import os
import random
import shutil
import subprocess
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["Host", "Network", "nftables_unavailable", "unavailable"]

_FIRST_HOST = 10  # host i gets 10.A.B.(10 + i)


def _ip(*args: str, namespace: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = ["ip", *(("netns", "exec", namespace, "ip") if namespace else ()), *args]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {result.returncode}: {result.stderr.strip()}")
    return result


_SPLIT_TABLE = "hpbchaos"  # the nftables table (family inet) a split loads into a namespace


def nftables_unavailable() -> str | None:
    """Why :meth:`Network.split` cannot work here (no ``nft``, or nftables refused), or None."""
    if shutil.which("nft") is None:
        return "no `nft` command (the network split needs nftables; on Debian: apt-get install nftables)"
    result = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        return f"`nft list tables` refused: {result.stderr.strip()}"
    return None


def _nft(namespace: str, script: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    argv = ["ip", "netns", "exec", namespace, "nft", *(("-f", "-") if script is not None else args)]
    return subprocess.run(argv, input=script, capture_output=True, text=True, timeout=30)


def unavailable() -> str | None:
    """Why this machine cannot run a :class:`Network` (the exact refusal), or None when it can:
    a throw-away namespace with a veth pair is made and removed to find out."""
    if os.geteuid() != 0:
        return f"network namespaces need root; running as uid {os.geteuid()}"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2) on the PATH"
    probe = f"hpb-probe-{uuid.uuid4().hex[:8]}"
    veth = f"hpbp{uuid.uuid4().hex[:8]}"
    try:
        for args in (("netns", "add", probe),
                     ("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", probe)):
            result = _ip(*args, check=False)
            if result.returncode != 0:
                return f"`ip {' '.join(args)}` refused: {result.stderr.strip()}"
        return None
    finally:
        _ip("link", "del", veth, check=False)
        _ip("netns", "del", probe, check=False)


def _free_subnet() -> ipaddress.IPv4Network:
    taken = []
    for args in (("-4", "-o", "addr", "show"), ("-4", "route", "show", "table", "all")):
        for word in _ip(*args).stdout.split():
            try:
                taken.append(ipaddress.ip_network(word, strict=False))
            except ValueError:
                continue
    for _ in range(100):
        subnet = ipaddress.ip_network(f"10.{random.randint(128, 254)}.{random.randint(0, 255)}.0/24")
        if not any(subnet.overlaps(other) for other in taken if other.prefixlen > 0):
            return subnet
    raise RuntimeError("no free 10.x.y.0/24 subnet")


@dataclass(frozen=True)
class Host:
    """One network namespace on the bridge."""

    name: str
    namespace: str
    veth: str  # the root namespace's end of the pair (the one :meth:`Network.cut` takes down)
    address: str

    def argv(self, *command: str) -> list[str]:
        """``command`` run inside this host's namespace (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.namespace, *command]


class Network:
    """A bridge and namespaces on a private /24 (module docstring).  Use as a context manager or
    call :meth:`close`."""

    def __init__(self) -> None:
        self.tag = uuid.uuid4().hex[:6]
        self.hosts: dict[str, Host] = {}
        self._namespaces: list[str] = []
        self._links: list[str] = []  # root-namespace interfaces made here, bridge last
        self.bridge = f"hpb{self.tag}br"
        subnet = _free_subnet()
        self.prefixlen = subnet.prefixlen
        addresses = list(subnet.hosts())
        self.gateway = str(addresses[0])  # the bridge's (root namespace's) address
        self._addresses = addresses
        self._blocked: list[tuple[str, str]] = []  # (host name, address it cannot reach) by split
        self._split_namespaces: list[str] = []  # namespaces holding a split's table
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            self._links.append(self.bridge)
            _ip("addr", "add", f"{self.gateway}/{self.prefixlen}", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add_host(self, name: str) -> Host:
        """A new namespace ``hpb-<tag>-<name>`` joined to the bridge, its loopback up."""
        index = len(self.hosts)
        host = Host(name, f"hpb-{self.tag}-{name}", f"hpb{self.tag}v{index}",
                    str(self._addresses[_FIRST_HOST - 1 + index]))
        _ip("netns", "add", host.namespace)
        self._namespaces.append(host.namespace)
        _ip("link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.namespace)
        self._links.insert(0, host.veth)
        _ip("link", "set", host.veth, "master", self.bridge, "up")
        _ip("addr", "add", f"{host.address}/{self.prefixlen}", "dev", "eth0", namespace=host.namespace)
        _ip("link", "set", "eth0", "up", namespace=host.namespace)
        _ip("link", "set", "lo", "up", namespace=host.namespace)
        self.hosts[name] = host
        return host

    def cut(self, name: str) -> None:
        """Cut ``name`` off from everything outside its namespace."""
        _ip("link", "set", self.hosts[name].veth, "down")

    def heal(self, name: str) -> None:
        """Undo :meth:`cut`."""
        _ip("link", "set", self.hosts[name].veth, "up")

    def split(self, groups: Sequence[Iterable[str]]) -> None:
        """Hosts in different ``groups`` can no longer reach each other, in either direction (module
        docstring); a split already in place is replaced.  ValueError for an unknown host or a host
        named in two groups."""
        members = [list(group) for group in groups]
        group_of: dict[str, int] = {}
        for index, group in enumerate(members):
            for name in group:
                if name not in self.hosts:
                    raise ValueError(f"split: no host {name!r} in this network (hosts: {sorted(self.hosts)})")
                if name in group_of:
                    raise ValueError(f"split: host {name!r} is named in two groups")
                group_of[name] = index
        self.join()
        if shutil.which("nft") is None:
            raise RuntimeError(nftables_unavailable() or "no nft")
        for name, index in group_of.items():
            others = [self.hosts[other].address for other, other_index in group_of.items()
                      if other_index != index]
            if not others:
                continue
            addresses = ", ".join(others)
            script = (f"table inet {_SPLIT_TABLE} {{\n"
                      f"  chain input {{ type filter hook input priority 0; policy accept; "
                      f"ip saddr {{ {addresses} }} drop; }}\n"
                      f"  chain output {{ type filter hook output priority 0; policy accept; "
                      f"ip daddr {{ {addresses} }} drop; }}\n}}\n")
            namespace = self.hosts[name].namespace
            self._split_namespaces.append(namespace)  # before loading: join() removes a half-made one
            result = _nft(namespace, script)
            if result.returncode != 0:
                raise RuntimeError(f"nft in {namespace} exited {result.returncode}: {result.stderr.strip()}")
            self._blocked += [(name, address) for address in others]

    def join(self) -> None:
        """Delete every table :meth:`split` loaded (nothing to do without a split)."""
        errors = []
        self._blocked.clear()
        while self._split_namespaces:
            namespace = self._split_namespaces.pop()
            result = _nft(namespace, None, "delete", "table", "inet", _SPLIT_TABLE)
            if result.returncode != 0 and "No such file or directory" not in result.stderr:
                errors.append(f"{namespace}: {result.stderr.strip()}")
        if errors:
            raise RuntimeError("removing the split's nftables tables: " + "; ".join(errors))

    def verify_split(self) -> str:
        """That the split in place holds: its table is loaded in each of its namespaces; the
        evidence, or RuntimeError naming what is missing."""
        if not self._split_namespaces:
            raise RuntimeError("no split in place")
        missing = [ns for ns in self._split_namespaces
                   if _nft(ns, None, "list", "table", "inet", _SPLIT_TABLE).returncode != 0]
        if missing:
            raise RuntimeError(f"the split's nftables table is missing in {missing}")
        return f"table inet {_SPLIT_TABLE} loaded in {len(self._split_namespaces)} namespaces"

    @property
    def blocked(self) -> list[tuple[str, str]]:
        """The split in place: (host name, address it cannot reach)."""
        return list(self._blocked)

    def close(self) -> None:
        """Remove what this network made (veths, then the bridge, then the namespaces)."""
        errors = []
        self._blocked.clear()  # the tables go with their namespaces
        self._split_namespaces.clear()
        for link in self._links:
            result = _ip("link", "del", link, check=False)
            if result.returncode != 0 and "Cannot find device" not in result.stderr:
                errors.append(result.stderr.strip())
        self._links.clear()
        for namespace in self._namespaces:
            result = _ip("netns", "del", namespace, check=False)
            if result.returncode != 0:
                errors.append(result.stderr.strip())
        self._namespaces.clear()
        if errors:
            raise RuntimeError("cleaning up the test network: " + "; ".join(errors))
