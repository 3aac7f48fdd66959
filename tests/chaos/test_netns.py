"""The chaos network: a split cuts every path between its groups in both directions while the
root namespace and hosts named in no group still reach everyone; join undoes it; a cut host is
cut off from the root namespace too; close leaves no namespace, link or table behind."""

from __future__ import annotations

import subprocess

import pytest
from chaos_probe import can_connect, connect_error, listen

from chaos import netns

PORT = 7777


@pytest.fixture(scope="module")
def network():
    reason = netns.unavailable() or netns.nftables_unavailable()
    if reason is not None:
        pytest.skip(f"network namespaces cannot be used here: {reason}")
    made = netns.Network()
    listeners = []
    try:
        for name in ("a", "b", "c", "d"):
            listeners.append(listen(made.add_host(name), PORT))
        yield made
    finally:
        for process in listeners:
            process.kill()
            process.wait()
        made.close()


def _reachable(network: netns.Network) -> set[tuple[str, str]]:
    """Every (from, to) pair of hosts (and "root") with a TCP connection accepted."""
    sources = {"root": None, **network.hosts}
    return {(source, target) for source, host in sources.items() for target in network.hosts
            if source != target and can_connect(host, network.hosts[target].address, PORT, timeout_s=1.0)}


def test_split_cuts_between_groups_both_ways_and_join_restores_everything(network):
    everyone = {(s, t) for s in ("root", "a", "b", "c", "d") for t in "abcd" if s != t}
    assert _reachable(network) == everyone
    network.split([["a"], ["b", "c"]])
    cut = {("a", "b"), ("a", "c"), ("b", "a"), ("c", "a")}
    assert _reachable(network) == everyone - cut
    assert sorted(network.blocked) == [("a", network.hosts["b"].address), ("a", network.hosts["c"].address),
                                       ("b", network.hosts["a"].address), ("c", network.hosts["a"].address)]
    # packets are dropped, as by Jepsen's iptables: a connect hangs until its timeout, both ways
    assert "timed out" in connect_error(network.hosts["a"], network.hosts["b"].address, PORT, 1.0)
    assert "timed out" in connect_error(network.hosts["c"], network.hosts["a"].address, PORT, 1.0)
    network.split([["a", "b"], ["c"]])  # a new split replaces the old one
    assert _reachable(network) == everyone - {("a", "c"), ("b", "c"), ("c", "a"), ("c", "b")}
    network.join()
    network.join()  # idempotent
    assert network.blocked == []
    assert _reachable(network) == everyone
    for host in network.hosts.values():
        tables = subprocess.run(host.argv("nft", "list", "tables"), capture_output=True, text=True)
        assert "hpbchaos" not in tables.stdout


def test_a_cut_host_reaches_nothing_and_nothing_reaches_it_until_healed(network):
    a = network.hosts["a"]
    network.cut("a")
    try:
        assert not can_connect(None, a.address, PORT, timeout_s=1.0)
        assert not can_connect(a, network.hosts["b"].address, PORT, timeout_s=1.0)
        assert can_connect(a, a.address, PORT)  # its own address still answers inside
    finally:
        network.heal("a")
    assert can_connect(None, a.address, PORT) and can_connect(a, network.hosts["b"].address, PORT)


def test_a_split_naming_an_unknown_or_twice_named_host_is_refused(network):
    with pytest.raises(ValueError, match="no host 'zz'"):
        network.split([["a"], ["zz"]])
    with pytest.raises(ValueError, match="named in two groups"):
        network.split([["a"], ["a", "b"]])
    assert network.blocked == []


def test_close_removes_every_namespace_link_and_route():
    reason = netns.unavailable()
    if reason is not None:
        pytest.skip(f"network namespaces cannot be used here: {reason}")
    made = netns.Network()
    made.add_host("x")
    made.add_host("y")
    made.split([["x"], ["y"]])
    namespaces = [host.namespace for host in made.hosts.values()]
    made.close()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert not any(namespace in listed for namespace in namespaces)
    assert f"hpb{made.tag}" not in links
