"""SOW keys and partitions.

Generated SOW key (AMPS User Guide ch. 7, "AMPS-Generated SOW Keys"; seeds/004): the hex
digest of xxh3-128 over the key domain and the canonical text of each key field value, joined
unambiguously. Same fields + values + key domain ⇒ same opaque key, in any topic sharing the
domain; different values ⇒ different keys. Publisher-supplied keys ("User-Generated SOW Keys")
may use only Base64 characters.
"""

from __future__ import annotations

import re

import orjson
import xxhash

from ..errors import KeyListError

USER_KEY = re.compile(r"[A-Za-z0-9+/=]{1,512}")
"""A publisher-supplied SOW key: 1-512 characters of the Base64 alphabet (incl. ``=``); always
matched against the whole string (``fullmatch``: ``$`` would accept a trailing newline)."""


MAX_KEYS = 10_000
"""Most SOW keys one query or ``sow_delete`` by keys may name (``--keys K1,K2,…``): a
sow_delete by keys travels as one log entry per partition, and a query reads them in one
pipeline. More raises :class:`~sow_redis.errors.KeyListError`; split the list."""


def check_key_list(keys: list[str]) -> list[str]:
    """``keys`` when every key is a possible SOW key (1-512 Base64 characters: generated keys
    are hex digests, publisher keys Base64) and there are at most :data:`MAX_KEYS`.

    A key holding a comma would split into two keys in a sow_delete log entry, and no stored
    record can have a key outside the alphabet, so such a list is refused, not searched.

    Raises:
        KeyListError: one line naming the bound (the count, or the first bad key's position).
    """
    if isinstance(keys, (str, bytes)):
        raise KeyListError("SOW keys must be a list of strings, not one string")
    if len(keys) > MAX_KEYS:
        raise KeyListError(f"{len(keys)} SOW keys given; at most {MAX_KEYS} per query or "
                           "sow_delete (split the list)")
    for i, k in enumerate(keys, 1):
        if not is_valid_user_key(k):
            shown = repr(k) if len(repr(k)) <= 40 else repr(k)[:37] + "..."
            raise KeyListError(f"SOW key {i} {shown} is not a SOW key (1-512 characters of "
                               "A-Z a-z 0-9 + / =)")
    return keys


def generate(domain: str, values: list[str]) -> str:
    """Opaque SOW key (32 hex digits) for canonical key values in a key domain."""
    return xxhash.xxh3_128_hexdigest(orjson.dumps([domain, *values]))


def is_valid_user_key(key: object) -> bool:
    """True when ``key`` is a string of 1-512 Base64 characters and nothing else (AMPS rule for
    user-generated keys); False for anything else (a number, a trailing newline, …)."""
    return isinstance(key, str) and USER_KEY.fullmatch(key) is not None


def partition_of(values: list[str], partitions: int) -> int:
    """Partition (0 … partitions-1) of a message from its partition-key values."""
    if partitions == 1:
        return 0
    return xxhash.xxh3_64_intdigest(orjson.dumps(values)) % partitions


def partition_of_key(sow_key: str, partitions: int) -> int:
    """Partition of a record from its SOW key (the key's own hash; any key text works)."""
    if partitions == 1:
        return 0
    return xxhash.xxh3_64_intdigest(sow_key.encode()) % partitions


def index_hash(values: list[str]) -> str:
    """Hash-index value hash (16 hex digits) of canonical values (strings, seeds/004)."""
    return xxhash.xxh3_64_hexdigest(orjson.dumps(values))
