"""A libp2p host for the ledger: a persistent Ed25519 identity, TCP, Noise as the only security, yamux only.

`libp2p.new_host()` without `sec_opt` also offers TLS, SECIO and *plaintext*; passing `sec_opt` with Noise alone
makes every other security protocol fail negotiation. The identity is a seed in a 0600 key file, so the peer id
survives restarts; the Noise static key is ephemeral (the identity key signs it in the handshake).
Measured facts behind each choice: ../shared/notes/libp2p-0.8.1.md and docs/ARCHITECTURE.md.
"""

from __future__ import annotations

import trio
from libp2p import new_host
from libp2p.abc import IHost
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.identity_utils import create_identity_from_seed
from libp2p.network.config import ConnectionConfig
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_PROTOCOL_ID
from libp2p.stream_muxer.yamux.yamux import Yamux
from multiaddr import Multiaddr

from ledger.errors import LedgerError


def key_pair(seed: bytes) -> KeyPair:
    """The peer key pair of a 32-byte seed (the node keeps it in a key file like its author key)."""
    return create_identity_from_seed(seed)


def peer_id(keys: KeyPair) -> ID:
    return ID.from_pubkey(keys.public_key)


def build_host(keys: KeyPair, listen: list[Multiaddr]) -> IHost:
    """A host that speaks Noise only and yamux only. One connection per peer: with the default (3) every
    successful dial still waits out a 250 ms happy-eyeballs delay (measured: 252 ms vs 4 ms)."""
    noise = NoiseTransport(keys, noise_privkey=create_x25519_key_pair().private_key)
    return new_host(
        key_pair=keys,
        listen_addrs=listen,
        sec_opt={NOISE_PROTOCOL_ID: noise},
        muxer_opt={TProtocol(YAMUX_PROTOCOL_ID): Yamux},
        connection_config=ConnectionConfig(max_connections_per_peer=1),
    )


def full_addrs(host: IHost) -> list[str]:
    """`/ip4/127.0.0.1/tcp/PORT/p2p/PEERID` for each bound listener (the real port, once `host.run` bound it)."""
    return [str(addr) for addr in host.get_addrs()]


def parse_peer_addr(text: str) -> tuple[ID, Multiaddr]:
    """A multiaddr ending in /p2p/PEERID, checked; raises LedgerError('p2p.address')."""
    try:
        addr = Multiaddr(text)
        info = info_from_p2p_addr(addr)
    except Exception as exc:  # multiaddr and libp2p raise a variety of types for a bad address
        raise LedgerError("p2p.address", f"{text!r}: not a multiaddr ending in /p2p/PEERID ({exc})") from None
    return info.peer_id, addr


async def connect(host: IHost, addr: str, timeout: float) -> ID:
    """Dial `addr` (ending in /p2p/PEERID). First lifts libp2p's 60 s block after a failed dial and forgets the
    peer's older addresses (the swarm dials only the first TCP address it knows, so a stale one would win).
    `timeout` is required: nothing in 0.8.1 bounds a Noise handshake with a peer that accepts and stays silent."""
    peer, multiaddr = parse_peer_addr(addr)
    info = info_from_p2p_addr(multiaddr)
    host.get_network().unblock_peer(peer)
    if peer not in host.get_connected_peers():
        host.get_peerstore().clear_addrs(peer)
    with trio.fail_after(timeout):
        await host.connect(info)
    return peer
