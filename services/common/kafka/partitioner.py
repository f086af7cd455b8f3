"""Which partition a keyed record goes to: Kafka's default rule, with the hash remembered.

Records keyed by a client id must land where every Kafka client puts them (murmur2 of the
key, made positive, modulo the partition count: the Java client's and aiokafka's default),
so that services agree on a client's partition. aiokafka computes murmur2 in pure Python on
every send, about 5 % of the router's time (bench/NOTES.md); the same few thousand client
ids come back all the time, so their hashes are kept.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from aiokafka.partitioner import murmur2

#: Hashes kept before the cache is emptied and starts again (bounds its memory).
CACHE_SIZE = 65_536

_hashes: dict[bytes, int] = {}


def key_hash(key: bytes) -> int:
    """murmur2 of ``key`` as a non-negative int (Kafka's ``toPositive(murmur2(key))``), of
    its part before the first NUL byte if it has one: a ``client.wills`` key (client id,
    NUL, connection id) lands in its client's partition. Client ids and Topic Names cannot
    hold NUL (MQTT-1.5.4-2), so every other key hashes whole, as other Kafka clients do."""
    value = _hashes.get(key)
    if value is None:
        if len(_hashes) >= CACHE_SIZE:
            _hashes.clear()
        value = _hashes[key] = murmur2(key.partition(b"\x00")[0]) & 0x7FFFFFFF
    return value


def partition_of(key: bytes | str, partitions: int) -> int:
    """The partition (0-based) of a record keyed by ``key`` in a topic of ``partitions``;
    a ``str`` key (a client id) is keyed by its UTF-8 bytes, as every record about that
    client is (docs/design.md: one client's records share a partition number in every topic)."""
    if isinstance(key, str):
        key = key.encode("utf-8")
    return key_hash(key) % partitions


def partition(key: bytes | None, all_partitions: Sequence[int], available: Sequence[int]) -> int:
    """aiokafka's partitioner interface: by key hash, or random for a record without key."""
    if key is None:
        return random.choice(available or all_partitions)
    return all_partitions[key_hash(key) % len(all_partitions)]
