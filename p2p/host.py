"""A libp2p host for the ledger: a persistent Ed25519 identity, TCP, Noise as the only security, yamux only.

`libp2p.new_host()` without `sec_opt` also offers TLS, SECIO and *plaintext*; passing `sec_opt` with Noise alone
makes every other security protocol fail negotiation. The identity is a seed in a 0600 key file, so the peer id
survives restarts; the Noise static key is ephemeral (the identity key signs it in the handshake).
Measured facts behind each choice: ../shared/notes/libp2p-0.8.1.md and docs/ARCHITECTURE.md.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable

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
from libp2p.protocol_muxer.exceptions import MultiselectClientError
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


IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_TCP_ENDPOINT = re.compile(r"/(ip4|ip6)/([^/]+)/tcp/(\d+)")


def tcp_endpoint(addr: Multiaddr | str) -> tuple[IPAddress, int] | None:
    """The IP address and TCP port a multiaddr names, or None for another form (/dns4/..., say)."""
    match = _TCP_ENDPOINT.match(str(addr))
    if match is None:
        return None
    try:
        return ipaddress.ip_address(match.group(2)), int(match.group(3))
    except ValueError:
        return None


def reaches_listener(endpoint: tuple[IPAddress, int], listening: Iterable[tuple[IPAddress, int] | None]) -> bool:
    """Whether a dial to `endpoint` arrives at one of the `listening` endpoints of this machine: the same port, and
    the same address, or any address of this machine for a listener on all of them (0.0.0.0, ::). A dial to 0.0.0.0
    goes to the loopback address."""
    address, port = endpoint
    if address.is_unspecified:
        address = ipaddress.ip_address("::1" if address.version == 6 else "127.0.0.1")
    for own in listening:
        if own is not None and own[1] == port and (own[0] == address or (own[0].is_unspecified and _local(address))):
            return True
    return False


def _local(address: IPAddress) -> bool:
    """An address of this machine: a loopback one, or one a socket can bind."""
    if address.is_loopback:
        return True
    with socket.socket(socket.AF_INET6 if address.version == 6 else socket.AF_INET) as probe:
        try:
            probe.bind((str(address), 0))
        except OSError:
            return False
    return True


def dial_to_self(host: IHost, peer: ID, addr: Multiaddr) -> str | None:
    """Why dialling `addr` (of `peer`) would reach this host itself, or None. Such a dial would list the node as its
    own peer and have it read its own log (Kubo refuses it too: "dial to self attempted")."""
    if peer == host.get_id():
        return "that is this node's own peer id"
    endpoint = tcp_endpoint(addr)
    if endpoint is not None and reaches_listener(endpoint, (tcp_endpoint(own) for own in host.get_addrs())):
        return f"{endpoint[0]} port {endpoint[1]} is where this node listens"
    return None


def refused_protocol(exc: BaseException) -> bool:
    """Whether a failed `new_stream` means the peer answered that it does not speak any protocol asked for
    (multistream's "na"), not that the stream or connection failed. py-libp2p 0.8.1 raises StreamFailure from a
    MultiselectClientError whose message alone says which."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, MultiselectClientError) and str(cause).startswith("protocols not supported: "):
            return "Last error: protocol not supported" in str(cause)
        cause = cause.__cause__ or cause.__context__
    return False


async def connect(host: IHost, addr: str, timeout: float) -> ID:
    """Dial `addr` (ending in /p2p/PEERID). First lifts libp2p's 60 s block after a failed dial and forgets the
    peer's older addresses (the swarm dials only the first TCP address it knows, so a stale one would win).
    `timeout` is required: nothing in 0.8.1 bounds a Noise handshake with a peer that accepts and stays silent.
    A dial that would reach this host itself raises LedgerError('p2p.self_dial')."""
    peer, multiaddr = parse_peer_addr(addr)
    refusal = dial_to_self(host, peer, multiaddr)
    if refusal is not None:
        raise LedgerError("p2p.self_dial", f"addr: {refusal}; a node does not dial itself")
    info = info_from_p2p_addr(multiaddr)
    host.get_network().unblock_peer(peer)
    if peer not in host.get_connected_peers():
        host.get_peerstore().clear_addrs(peer)
    with trio.fail_after(timeout):
        await host.connect(info)
    return peer
