"""Byte mutations of valid model files (shared by the in-process and the CLI byte fuzzers)."""

from __future__ import annotations

import random

KINDS = ("flip", "truncate", "insert", "delete", "splice", "varint")


def mutate(data: bytes, rng: random.Random) -> bytes:
    """One random structural damage: bit flips, truncation, inserted/deleted/duplicated bytes, or a
    byte set to a large varint continuation (0xff), which tends to corrupt protobuf lengths."""
    b = bytearray(data)
    kind = rng.choice(KINDS)
    if kind == "flip":
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        del b[rng.randrange(1, len(b)) :]
    elif kind == "insert":
        i = rng.randrange(len(b))
        b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    elif kind == "delete":
        i = rng.randrange(len(b))
        del b[i : i + rng.randint(1, 64)]
    elif kind == "splice":
        i, j = sorted(rng.randrange(len(b)) for _ in range(2))
        b[i:i] = b[j : j + 32]
    else:
        for _ in range(rng.randint(1, 3)):
            b[rng.randrange(len(b))] = 0xFF
    return bytes(b)
