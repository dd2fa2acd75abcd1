"""The network: a libp2p host, gossip of operations, log-based sync, peers (imports `ledger`, never `node`)."""
