"""The data layer: encoding, identity, keys, operations and their validation. Synchronous, no networking."""
