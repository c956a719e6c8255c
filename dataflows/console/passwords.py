"""Console passwords, stored as scrypt hashes: slow to guess even when the config file leaks.

Tokens are long random strings, so their SHA-256 is enough; passwords are chosen by
people, so they get a memory-hard hash with a per-password salt. The stored form is
``scrypt$N$r$p$salt$hash`` (base64), what ``trainguard hash-password`` prints.

>>> stored = hash_password("correct horse", n=2**10)
>>> stored.startswith("scrypt$1024$8$1$")
True
>>> verify_password(stored, "correct horse"), verify_password(stored, "wrong horse")
(True, False)
>>> verify_password("scrypt$oops", "anything")
False
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

_PREFIX = "scrypt"
_MAX_N = 2**20  # keeps a hostile config from asking for gigabytes per check


def hash_password(password: str, n: int = 2**14, r: int = 8, p: int = 1) -> str:
    """The storable scrypt hash of ``password`` with a fresh 16-byte salt."""
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, dklen=32)
    encode = base64.b64encode
    return f"{_PREFIX}${n}${r}${p}${encode(salt).decode()}${encode(digest).decode()}"


def check_format(stored: str) -> str | None:
    """Why ``stored`` is not a hash :func:`hash_password` could have made, or ``None`` if it is."""
    parts = stored.split("$")
    if len(parts) != 6 or parts[0] != _PREFIX:
        return "is not of the form scrypt$N$r$p$salt$hash (use `trainguard hash-password`)"
    try:
        n, r, p = (int(x) for x in parts[1:4])
        base64.b64decode(parts[4], validate=True)
        base64.b64decode(parts[5], validate=True)
    except ValueError:
        return "has a non-numeric cost or a salt/hash that is not base64"
    if not (2 <= n <= _MAX_N and n & (n - 1) == 0 and 1 <= r <= 32 and 1 <= p <= 16):
        return f"asks for N={n}, r={r}, p={p}; N must be a power of two up to {_MAX_N}, r ≤ 32, p ≤ 16"
    return None


def verify_password(stored: str, password: str) -> bool:
    """Whether ``password`` matches ``stored`` (constant-time comparison); a malformed ``stored`` never matches."""
    if check_format(stored) is not None:
        return False
    _, n, r, p, salt, expected = stored.split("$")
    digest = hashlib.scrypt(
        password.encode(), salt=base64.b64decode(salt), n=int(n), r=int(r), p=int(p), dklen=32, maxmem=2**30
    )
    return hmac.compare_digest(digest, base64.b64decode(expected))
