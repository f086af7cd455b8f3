"""services/common/kafka/partitioner.py: the same partitions as Kafka's default partitioner."""

from __future__ import annotations

from aiokafka.partitioner import DefaultPartitioner
from hypothesis import given
from hypothesis import strategies as st

from services.common.kafka import partitioner
from services.common.records import will_key


@given(st.binary(max_size=64).filter(lambda key: b"\x00" not in key), st.integers(1, 64))
def test_same_partition_as_aiokafkas_default(key: bytes, count: int) -> None:
    # Every key but a client.wills key (no Client Identifier or Topic Name holds NUL).
    partitions = list(range(count))
    expected = DefaultPartitioner()(key, partitions, partitions)
    assert partitioner.partition(key, partitions, partitions) == expected
    assert partitioner.partition_of(key, count) == expected


@given(st.text(max_size=30).filter(lambda c: "\x00" not in c), st.binary(min_size=16, max_size=16))
def test_a_will_lands_in_its_clients_partition(client_id: str, connection_id: bytes) -> None:
    key = will_key(client_id, connection_id)
    assert partitioner.partition_of(key, 12) == partitioner.partition_of(client_id, 12)


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
