"""Chained KV-block hashes of a prompt, in the gateway's own key space.

Algorithm: a prompt's token ids are cut into full blocks of ``block_size``
tokens (a trailing partial block is never hashed: the engine does not cache
it either). Block ``i`` hashes to::

    h_i = xxh3_64( h_{i-1} as 8 little-endian bytes || token ids of block i )

where each token id is packed as an unsigned 32-bit little-endian integer and
``h_{-1}`` is the chain seed of the request's namespace (model and cache
salt, see :func:`chain_seed`). Because every hash folds in its parent, equal
``h_i`` means equal tokens ``0 .. (i+1)*block_size`` (up to 64-bit collisions):
a replica holding block ``i`` of a chain is assumed to hold its whole prefix.

The hashes are ours, not vLLM's: the precise index re-hashes the token ids
that vLLM publishes in ``BlockStored`` events with this same function, so the
gateway never depends on the engine's hash algorithm or ``PYTHONHASHSEED``.

Speed: the per-token work is done in C (one ``array('I')`` conversion, one
``bytes`` copy); Python runs one loop iteration per *block*. A gateway that
memoizes a stable prefix extends its last hash with :func:`extend` instead of
re-hashing from the seed.

Parameters: none (``block_size`` is the replica's, passed per call).
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence

import xxhash

_xxh3 = xxhash.xxh3_64_intdigest

_SEED_DOMAIN = b"prefixgate/chain/v1\x00"
_NO_SALT = b"\x00"
_SALT = b"\x01"

_TOKEN_TYPECODE = "I"
if array(_TOKEN_TYPECODE).itemsize != 4:  # pragma: no cover - exotic platforms
    _TOKEN_TYPECODE = "L" if array("L").itemsize == 4 else "H"
_BYTES_PER_TOKEN = 4


def chain_seed(model: str, cache_salt: str | None) -> int:
    """The parent hash of a prompt's first block.

    Different models or cache salts never share blocks (vLLM isolates salted
    requests the same way). ``None`` and ``""`` are different salts on
    purpose: an explicit empty salt is still the caller's choice.
    """
    salt = _NO_SALT if cache_salt is None else _SALT + cache_salt.encode("utf-8")
    return _xxh3(_SEED_DOMAIN + model.encode("utf-8") + b"\x00" + salt)


def token_bytes(token_ids: Sequence[int]) -> bytes:
    """Token ids packed as unsigned 32-bit little-endian integers."""
    if isinstance(token_ids, array) and token_ids.typecode == _TOKEN_TYPECODE:
        packed = token_ids
    else:
        try:
            packed = array(_TOKEN_TYPECODE, token_ids)
        except OverflowError:
            raise ValueError("token ids must be in [0, 2**32)") from None
    if sys.byteorder == "big":  # pragma: no cover - keep one key space everywhere
        packed = array(_TOKEN_TYPECODE, packed)
        packed.byteswap()
    return packed.tobytes()


def extend(parent_hash: int, token_ids: Sequence[int], block_size: int) -> list[int]:
    """Hashes of the full blocks of ``token_ids``, chained onto ``parent_hash``.

    ``extend(h, tail, bs)`` equals the last part of ``block_hashes(prefix +
    tail, bs, seed)`` when ``h`` is the hash of the prefix's last block (the
    prefix itself being whole blocks). A trailing partial block is ignored.
    """
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    raw = token_bytes(token_ids)
    stride = block_size * _BYTES_PER_TOKEN
    end = (len(raw) // stride) * stride
    hashes: list[int] = []
    append = hashes.append
    parent = parent_hash
    for offset in range(0, end, stride):
        parent = _xxh3(parent.to_bytes(8, "little") + raw[offset : offset + stride])
        append(parent)
    return hashes


def block_hashes(token_ids: Sequence[int], block_size: int, seed: int) -> list[int]:
    """Chained hashes of every full block of a prompt, starting from ``seed``."""
    return extend(seed, token_ids, block_size)


def full_blocks(token_count: int, block_size: int) -> int:
    """How many full blocks ``token_count`` tokens make."""
    return token_count // block_size
