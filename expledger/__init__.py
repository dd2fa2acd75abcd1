"""Experience Ledger's Python client: `from expledger import Client` (README "Agents: the proxy and the Python
client")."""

from expledger.client import Client, DaemonUnavailable, ExpledgerError, RpcFailed

__all__ = ["Client", "DaemonUnavailable", "ExpledgerError", "RpcFailed"]
