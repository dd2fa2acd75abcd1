"""The daemon side: wiring, configuration, RPC, command line."""
