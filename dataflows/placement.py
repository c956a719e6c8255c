"""Choose Bytewax state keys that live on a chosen worker, so a shard's data never leaves its process.

Bytewax sends every keyed item to the worker that owns its key; a key's owner is
SipHash-1-3 (zero keys) of the key's UTF-8 bytes plus Rust's ``0xff`` string
terminator, modulo the worker count — Rust's ``DefaultHasher`` over the
``StateKey`` string, as Bytewax 0.21 does it (``tests/unit/dataflows/test_sharding.py`` runs a
real multi-worker flow to check that this still holds).

A sharded flow keys shard ``i``'s router, and each job it owns, with keys that
land on worker ``i``: the worker whose replay partition read those records.
Records then go source → router → detector without being pickled to another
process. A wrong guess would cost speed, never correctness: Bytewax still
delivers every key to its one owner.

>>> worker_of("router-3", 2), worker_of("router-0", 2)
(1, 0)
>>> [worker_of(key_on_worker("job/7", w, 3), 3) for w in range(3)]
[0, 1, 2]
>>> key_on_worker("job/7", 0, 1)
'job/7'
"""

from __future__ import annotations

from functools import lru_cache

_MASK = (1 << 64) - 1


def _rotl(x: int, bits: int) -> int:
    return ((x << bits) | (x >> (64 - bits))) & _MASK


def siphash13(data: bytes) -> int:
    """SipHash-1-3 with a zero key (Rust's ``DefaultHasher::new()``).

    >>> hex(siphash13(b""))
    '0xd1fba762150c532c'
    """
    v0, v1, v2, v3 = 0x736F6D6570736575, 0x646F72616E646F6D, 0x6C7967656E657261, 0x7465646279746573

    def sip_round() -> None:
        nonlocal v0, v1, v2, v3
        v0 = (v0 + v1) & _MASK
        v1 = _rotl(v1, 13) ^ v0
        v0 = _rotl(v0, 32)
        v2 = (v2 + v3) & _MASK
        v3 = _rotl(v3, 16) ^ v2
        v0 = (v0 + v3) & _MASK
        v3 = _rotl(v3, 21) ^ v0
        v2 = (v2 + v1) & _MASK
        v1 = _rotl(v1, 17) ^ v2
        v2 = _rotl(v2, 32)

    n = len(data)
    whole = n - n % 8
    for i in range(0, whole, 8):
        m = int.from_bytes(data[i : i + 8], "little")
        v3 ^= m
        sip_round()
        v0 ^= m
    last = ((n & 0xFF) << 56) | int.from_bytes(data[whole:], "little")
    v3 ^= last
    sip_round()
    v0 ^= last
    v2 ^= 0xFF
    for _ in range(3):
        sip_round()
    return v0 ^ v1 ^ v2 ^ v3


def worker_of(key: str, workers: int) -> int:
    """The worker (of ``workers``) that Bytewax gives a state key to."""
    return siphash13(key.encode() + b"\xff") % workers if workers > 1 else 0


@lru_cache(maxsize=1 << 16)
def key_on_worker(base: str, worker: int, workers: int) -> str:
    """``base``, or ``base~N`` with the smallest N that Bytewax places on ``worker``.

    Cached: a router calls it for every item, and sees the same few thousand keys.
    """
    if workers <= 1 or worker_of(base, workers) == worker:
        return base
    salt = 0
    while True:
        key = f"{base}~{salt}"
        if worker_of(key, workers) == worker:
            return key
        salt += 1
