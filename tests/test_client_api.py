"""The public client (`from expledger import Client`): a method for every RPC method, the daemon found through its
home, errors as exceptions carrying the RPC code."""

from __future__ import annotations

import inspect

import pytest

import expledger
from expledger import Client, DaemonUnavailable, ExpledgerError, RpcFailed
from tests.daemons import init_home, running
from tests.test_rpc_docs import registered_methods

NETWORK_METHODS = {"peers", "peers.connect", "peers.disconnect"}  # registered only by a node with p2p
GEOMETRY = "When intersecting lines with segments, check each solution lies on the segment, not its extension."


def test_every_rpc_method_has_a_typed_method():
    for method in registered_methods() | NETWORK_METHODS:
        function = getattr(Client, method.replace(".", "_"), None)
        assert callable(function), method
        hints = inspect.signature(function)
        assert all(p.annotation is not inspect.Parameter.empty for p in hints.parameters.values() if p.name != "self")
    assert expledger.__all__ == ["Client", "DaemonUnavailable", "ExpledgerError", "RpcFailed"]


def test_no_daemon_is_an_exception_naming_the_home(tmp_path):
    home = tmp_path / "home"
    init_home(home)
    with pytest.raises(DaemonUnavailable) as missing:
        Client(home)
    assert missing.value.code == "daemon.not_running" and str(home) in missing.value.message


def test_the_client_calls_the_node_found_through_its_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    init_home(home)
    with running(home) as daemon:
        monkeypatch.setenv("EXPLEDGER_HOME", str(home))
        node = Client()  # through $EXPLEDGER_HOME
        added = node.add(GEOMETRY, domain="math.geometry", confidence=0.8)
        assert added["outcome"] == "applied"
        exp_id = added["cid"]
        assert node.get(exp_id)["text"] == GEOMETRY
        assert [hit["id"] for hit in node.retrieve("Where do two lines cross a segment?")["hits"]] == [exp_id]
        assert node.usage(exp_id)["experiences"][0]["usage_count"] == 1
        assert node.list(domain="math")["experiences"][0]["usage_count"] == 1
        assert node.vote(exp_id, "up")["outcome"] == "applied"
        assert node.proof_inclusion(node.get(exp_id)["library"]["version"])["tree_size"] == 2
        assert node.state_root() == daemon.call("state_root")
        with pytest.raises(RpcFailed) as refused:
            node.retrieve("lines", k=500)
        assert refused.value.rpc_code == -32602 and refused.value.code == "params.range"
        assert isinstance(refused.value, ExpledgerError)
        with pytest.raises(RpcFailed) as unknown:
            node.history("bafyreic2yx24j37t2rjrbfg7tnnqrf63vclwbcqlezqotxsapur5v2hmmm")
        assert (unknown.value.rpc_code, unknown.value.code) == (-32002, "not_found.experience")
        direct = Client(url=daemon.url, token=daemon.token)  # a node not in a home at hand
        assert direct.status()["log_size"] == 2
        with pytest.raises(DaemonUnavailable) as no_proxy:
            _ = node.proxy_url
        assert no_proxy.value.code == "proxy.not_running"
        with pytest.raises(DaemonUnavailable) as refused_token:
            Client(url=daemon.url, token="x" * 64).status()
        assert refused_token.value.code == "daemon.unauthorized"
