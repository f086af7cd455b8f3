"""services/common/kafka/partitioner.py: the same partitions as Kafka's default partitioner."""

from __future__ import annotations

from aiokafka.partitioner import DefaultPartitioner
from hypothesis import given
from hypothesis import strategies as st

from services.common.kafka import partitioner


@given(st.binary(max_size=64), st.integers(1, 64))
def test_same_partition_as_aiokafkas_default(key: bytes, count: int) -> None:
    partitions = list(range(count))
    expected = DefaultPartitioner()(key, partitions, partitions)
    assert partitioner.partition(key, partitions, partitions) == expected
    assert partitioner.partition_of(key, count) == expected


def test_known_vector_of_the_java_client() -> None:
    # Kafka's Utils.murmur2("21") = -973932308 (org.apache.kafka.common.utils.UtilsTest).
    assert partitioner.key_hash(b"21") == -973932308 & 0x7FFFFFFF


def test_a_keyless_record_goes_to_an_available_partition() -> None:
    assert partitioner.partition(None, [0, 1, 2], [2]) == 2
    assert partitioner.partition(None, [0, 1, 2], []) in (0, 1, 2)


def test_the_cache_stays_bounded() -> None:
    for i in range(partitioner.CACHE_SIZE + 10):
        partitioner.key_hash(str(i).encode())
    assert len(partitioner._hashes) <= partitioner.CACHE_SIZE
