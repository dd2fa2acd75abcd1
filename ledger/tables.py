"""The LevelDB tables of a node's database: each table's one-byte tag, the meta keys, and the functions that
build and parse every key (keys are made nowhere else). ledger/store.py holds the database and its transactions;
docs/ARCHITECTURE.md says which module owns which table."""

from __future__ import annotations

import struct

from ledger.cid import CID_LENGTH

# Table tags (the first byte of every key). Keys are built and parsed only by the functions
# below, so no other module knows a layout. Owners: the log (merkle.py) L, S, N and the log size;
# the ingest path B, K, P, W, A, H and the other META names; the library (ledger/library/) X, D, V, O,
# T, Y, R, C, G, Q, J, E, Z, U and META last_add (I names bucket marks, which only the key filter holds).
META = b"M"  # M name -> value
BLOCK = b"B"  # B cid -> where its operation bytes lie in the block files (blockfile.LOCATOR)
SEQ = b"S"  # S cid -> u64 position in the local log
LOG = b"L"  # L u64 -> cid
NODE = b"N"  # N u8 level, u64 index -> hash of a perfect Merkle subtree (level 0: leaf hash)
OPMETA = b"K"  # K cid -> u64 clock, u8 kind, u8 counts, parent and target cids (what causality needs)
PENDING = b"P"  # P cid -> cids it still waits for
WAITER = b"W"  # W dependency cid, waiting cid -> ""
HEAD = b"H"  # H u64 (2^64 - 1 - clock), cid -> "" (applied operations no applied operation names as parent)
BY_AUTHOR = b"A"  # A author did, 0x00, u64 seq -> cid
BY_TARGET = b"T"  # T target cid, kind byte, order -> "" (applied operations naming a target, by kind)
ORDER = b"O"  # O order (u64 clock, cid) -> "" (applied operations in canonical order)
EXPERIENCE = b"X"  # X experience id -> experience record
BY_DOMAIN = b"D"  # D domain path, 0x00, experience id -> "" (live experiences)
STATUS = b"V"  # V cid -> what the fold made of that operation
VOTES = b"Y"  # Y experience id, author did -> the author's latest vote naming that experience
COUNTED = b"R"  # R root experience id, author did -> the author's vote that counts for that root
COMPONENT = b"C"  # C experience id -> its component's id (experiences linked by absorption and merges, §7.5)
MEMBER = b"G"  # G component id, experience id -> ""
COMPONENT_OP = b"Q"  # Q component id, order -> kind byte (its operations other than votes, in fold order)
ABSORBS = b"E"  # E add cid -> F, the add it is absorbed into (the earliest earlier near-duplicate sharing a band, §7.6)
BUCKET = b"Z"  # Z band number, band hash, u64 anchor clock, order -> "" (locality-sensitive hash buckets of adds)
BUCKET_MARK = b"I"  # I band number, band hash: the bucket holds an add (a key of the key filter alone, in no table)
COMPONENT_SIZE = b"J"  # J component id -> u64 number of members
VECTOR = b"F"  # F add cid -> its float16 embedding: written by earlier versions, deleted at open
LISTED = b"U"  # U experience id, list tag, cid -> "" (a record's list of absorbed ids or deletes too long for it)

U64 = struct.Struct(">Q")
_MAX_U64 = (1 << 64) - 1

FORMAT_KEY = META + b"format"
LOG_SIZE = META + b"log_size"
STATE_ROOT = META + b"state_root"
GENERATION = META + b"library_generation"  # bumped by every committed change to the library
NETWORK = META + b"network"  # the network parameters the directory was created with
LAST_ADD = META + b"last_add"  # the greatest order (clock, CID) of any add in the hash buckets
REBUILDING = META + b"rebuilding"  # a library rebuild has begun and not ended: the next open starts it again
BUCKETS_MARKED = META + b"buckets_marked"  # written beside the I table while it existed; dropped with it
#: every record keeps at most `records.INLINE_LIST` ids per list itself (longer lists are in the U table)
LISTS_OUTSIDE = META + b"lists_outside"
BLOCKS_END = META + b"blocks_end"  # where the block files end, as of this write (blockfile.END)


def u64(value: int) -> bytes:
    return U64.pack(value)


def read_u64(raw: bytes | None) -> int:
    """A stored big-endian counter; absent counts as 0."""
    return int.from_bytes(raw, "big") if raw else 0


# --- key builders and parsers ---------------------------------------------------------------


def block_key(cid: bytes) -> bytes:
    return BLOCK + cid


def seq_key(cid: bytes) -> bytes:
    return SEQ + cid


def log_key(position: int) -> bytes:
    return LOG + u64(position)


def merkle_node_key(level: int, index: int) -> bytes:
    return NODE + bytes([level]) + u64(index)


def opmeta_key(cid: bytes) -> bytes:
    return OPMETA + cid


def pending_key(cid: bytes) -> bytes:
    return PENDING + cid


def cid_of_key(key: bytes) -> bytes:
    """The CID of a key made of a tag and one CID (B, S, K, P, X, V, ...)."""
    return key[1:]


def waiter_key(dependency: bytes, waiter: bytes) -> bytes:
    return WAITER + dependency + waiter


def waiter_prefix(dependency: bytes = b"") -> bytes:
    return WAITER + dependency


def parse_waiter_key(key: bytes) -> tuple[bytes, bytes]:
    """(dependency, waiting operation)."""
    return key[1 : 1 + CID_LENGTH], key[1 + CID_LENGTH :]


def head_key(clock: int, cid: bytes) -> bytes:
    """Heads scan newest first (ties by CID), so a new operation's parents are the first few keys, not a sort."""
    return HEAD + u64(_MAX_U64 - clock) + cid


def cid_of_head_key(key: bytes) -> bytes:
    return key[1 + U64.size :]


def by_author_prefix(author: str) -> bytes:
    return BY_AUTHOR + author.encode() + b"\x00"


def by_author_key(author: str, position: int) -> bytes:
    return by_author_prefix(author) + u64(position)


def order_key(clock: int, cid: bytes) -> bytes:
    """Canonical fold order (clock, binary CID) as bytes that sort the same way."""
    return u64(clock) + cid


def order_cid(order: bytes) -> bytes:
    return order[8:]


def ordered_key(order: bytes) -> bytes:
    return ORDER + order


def parse_ordered_key(key: bytes) -> bytes:
    """The order (clock, CID) of an ORDER key."""
    return key[1:]


def by_target_key(target: bytes, kind: bytes, order: bytes) -> bytes:
    """`kind` is the one-byte kind of the operation naming `target`."""
    return BY_TARGET + target + kind + order


def by_target_prefix(target: bytes, kind: bytes = b"") -> bytes:
    """Keys of the operations naming `target` (of one kind, if given)."""
    return BY_TARGET + target + kind


def parse_by_target_key(key: bytes) -> tuple[bytes, bytes]:
    """(kind byte, order) of the operation naming the target."""
    return key[1 + CID_LENGTH : 2 + CID_LENGTH], key[2 + CID_LENGTH :]


def experience_key(exp_id: bytes) -> bytes:
    return EXPERIENCE + exp_id


def is_experience_key(key: bytes) -> bool:
    return key[:1] == EXPERIENCE


def by_domain_prefix(domain: str, *, subdomains: bool = False) -> bytes:
    """Keys of experiences in exactly `domain`, or (subdomains) in the domains under it."""
    return BY_DOMAIN + domain.encode() + (b"." if subdomains else b"\x00")


def by_domain_key(domain: str, exp_id: bytes) -> bytes:
    return by_domain_prefix(domain) + exp_id


def parse_by_domain_key(key: bytes) -> bytes:
    """The experience id of a BY_DOMAIN key."""
    return key[-CID_LENGTH:]


def status_key(cid: bytes) -> bytes:
    return STATUS + cid


def votes_prefix(exp_id: bytes) -> bytes:
    return VOTES + exp_id


def votes_key(exp_id: bytes, author: str) -> bytes:
    return VOTES + exp_id + author.encode()


def parse_votes_key(key: bytes) -> tuple[bytes, str]:
    """(experience id, author did) of a VOTES or COUNTED key."""
    return key[1 : 1 + CID_LENGTH], key[1 + CID_LENGTH :].decode()


def counted_prefix(root: bytes) -> bytes:
    return COUNTED + root


def counted_key(root: bytes, author: str) -> bytes:
    return COUNTED + root + author.encode()


def component_key(exp_id: bytes) -> bytes:
    return COMPONENT + exp_id


def member_prefix(component: bytes) -> bytes:
    return MEMBER + component


def member_key(component: bytes, exp_id: bytes) -> bytes:
    return MEMBER + component + exp_id


def parse_member_key(key: bytes) -> bytes:
    """The experience id of a MEMBER key."""
    return key[1 + CID_LENGTH :]


def component_op_prefix(component: bytes) -> bytes:
    return COMPONENT_OP + component


def component_op_key(component: bytes, order: bytes) -> bytes:
    return COMPONENT_OP + component + order


def parse_component_op_key(key: bytes) -> bytes:
    """The order (clock, CID) of a COMPONENT_OP key."""
    return key[1 + CID_LENGTH :]


def absorbs_key(add: bytes) -> bytes:
    return ABSORBS + add


def listed_prefix(exp_id: bytes, tag: bytes = b"") -> bytes:
    """`tag`: which of the record's lists (`records.ExperienceRecord.outside`); all of them if empty."""
    return LISTED + exp_id + tag


def listed_key(exp_id: bytes, entry: bytes) -> bytes:
    """`entry`: a list's tag byte, then an id (`records.ExperienceRecord.outside`)."""
    return LISTED + exp_id + entry


def parse_listed_key(key: bytes) -> bytes:
    """The id of a LISTED key."""
    return key[2 + CID_LENGTH :]


def component_size_key(component: bytes) -> bytes:
    return COMPONENT_SIZE + component


def bucket_prefix(band: bytes) -> bytes:
    """`band` is a band key (band number and hash) from `ledger.neardup.band_keys`."""
    return BUCKET + band


def bucket_key(band: bytes, order: bytes, anchor: bytes) -> bytes:
    """An add's key in the bucket `band`. `anchor` is the order of its F when it was indexed (its own if it had
    none): a late add can take over only the adds whose F sorts after it, and F only ever moves earlier, so
    the anchor's clock ahead of the order lets it skip the others by where it starts reading (PROTOCOL.md §7.6)."""
    return BUCKET + band + anchor[:8] + order


def bucket_mark_key(band: bytes) -> bytes:
    return BUCKET_MARK + band


def parse_bucket_key(key: bytes, band: bytes) -> bytes:
    """The order (clock, CID) of an add in the bucket `band`."""
    return key[1 + len(band) + 8 :]


def join_cids(cids: list[bytes]) -> bytes:
    """A list of binary CIDs as one value (what a pending operation still waits for)."""
    return b"".join(cids)


def split_cids(raw: bytes) -> list[bytes]:
    return [raw[i : i + CID_LENGTH] for i in range(0, len(raw), CID_LENGTH)]


def prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key that starts with `prefix`."""
    trimmed = prefix.rstrip(b"\xff")
    return trimmed[:-1] + bytes([trimmed[-1] + 1]) if trimmed else b"\xff" * (len(prefix) + 1)
