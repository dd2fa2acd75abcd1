"""`expledger devnet`: several nodes on one machine, started, watched and stopped as one network.

A launcher on top of `node` (imports point devnet -> node -> p2p -> ledger): each node is an ordinary home
made by `node.home.Home.init` and an ordinary `expledger daemon --detach`, so whatever works on a devnet
works on nodes set up by hand.
"""
