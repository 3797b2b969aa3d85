"""A few Kafka wire-protocol requests the Python client does not offer.

Only what queueplane needs, over a connection secured as the clients' are (connection.py): ApiVersions v3,
whose answer carries the cluster's finalized feature levels (share.version); a share group's
offsets and lag (DescribeShareGroupOffsets) and its state and members (ShareGroupDescribe),
which confluent-kafka's admin client does not describe for share groups.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field

from queueplane.kafka.connection import connect
from queueplane.kafka.refused import refuse_if_unauthorized
from queueplane.kafka.wire import Reader, compact_string, recv_exact, uvarint

API_VERSIONS_KEY = 18


@dataclass
class ApiVersions:
    """What a broker said about itself: API version ranges and finalized feature levels."""

    api_ranges: dict[int, tuple[int, int]] = field(default_factory=dict)
    finalized_features: dict[str, int] = field(default_factory=dict)


def api_versions(host: str, port: int, timeout: float = 5.0, settings: Mapping[str, str] | None = None) -> ApiVersions:
    """Send ApiVersions v3 (over the clients' security, ``settings``) and decode the answer,
    including its feature tagged fields."""
    client_id = b"queueplane"
    header = struct.pack(">hhih", API_VERSIONS_KEY, 3, 1, len(client_id)) + client_id + uvarint(0)
    body = compact_string("queueplane") + compact_string("1") + uvarint(0)
    payload = header + body
    with connect(host, port, settings or {}, timeout) as sock:
        sock.sendall(struct.pack(">i", len(payload)) + payload)
        size = struct.unpack(">i", recv_exact(sock, 4))[0]
        reader = Reader(recv_exact(sock, size))
    reader.int32()  # correlation id; ApiVersions responses use header v0 (no tags)
    error = reader.int16()
    if error:
        raise ConnectionError(f"ApiVersions failed with Kafka error code {error}")
    result = ApiVersions()
    for _ in range(reader.uvarint() - 1):
        key, lo, hi = reader.int16(), reader.int16(), reader.int16()
        reader.skip_tags()
        result.api_ranges[key] = (lo, hi)
    reader.int32()  # throttle time
    for _ in range(reader.uvarint()):
        tag, size = reader.uvarint(), reader.uvarint()
        tagged = Reader(reader.take(size))
        if tag == 2:
            for _ in range(tagged.uvarint() - 1):
                name, max_level, _min_level = tagged.compact_string(), tagged.int16(), tagged.int16()
                tagged.skip_tags()
                result.finalized_features[name] = max_level
    return result


FIND_COORDINATOR_KEY = 10
DESCRIBE_SHARE_GROUP_OFFSETS_KEY = 90
SHARE_GROUP_DESCRIBE_KEY = 77
GROUP_ID_NOT_FOUND = 69
_KEY_TYPE_GROUP = 0


def _compact_array(items: list[bytes]) -> bytes:
    return uvarint(len(items) + 1) + b"".join(items)


class _FlexibleClient:
    """One connection speaking flexible request/response versions (header v2 / v1)."""

    def __init__(self, host: str, port: int, settings: Mapping[str, str], timeout: float):
        self.sock = connect(host, port, settings, timeout)
        self.correlation = 0

    def __enter__(self) -> _FlexibleClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def request(self, api_key: int, version: int, body: bytes) -> Reader:
        self.correlation += 1
        client_id = b"queueplane"
        header = struct.pack(">hhih", api_key, version, self.correlation, len(client_id)) + client_id + uvarint(0)
        payload = header + body
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)
        size = struct.unpack(">i", recv_exact(self.sock, 4))[0]
        reader = Reader(recv_exact(self.sock, size))
        if reader.int32() != self.correlation:
            raise ConnectionError("Kafka answered another request")
        reader.skip_tags()
        return reader


def _nullablecompact_string(reader: Reader) -> str | None:
    length = reader.uvarint() - 1
    return None if length < 0 else reader.take(length).decode()


def first_server(settings: Mapping[str, str]) -> tuple[str, int]:
    """The first of ``bootstrap.servers`` as host and port."""
    first = settings.get("bootstrap.servers", "").split(",")[0].strip()
    host, _, port = first.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"bootstrap.servers {first!r} is not host:port")
    return host, int(port)


def _group_coordinator(settings: Mapping[str, str], group: str, timeout: float) -> tuple[str, int]:
    """The broker that coordinates ``group`` (FindCoordinator v6), at the listener we came in on."""
    host, port = first_server(settings)
    with _FlexibleClient(host, port, settings, timeout) as client:
        body = bytes([_KEY_TYPE_GROUP]) + _compact_array([compact_string(group)]) + uvarint(0)
        reader = client.request(FIND_COORDINATOR_KEY, 6, body)
        reader.int32()  # throttle
        coordinators = []
        for _ in range(reader.uvarint() - 1):
            reader.compact_string()
            node, chost, cport, error = reader.int32(), reader.compact_string(), reader.int32(), reader.int16()
            _nullablecompact_string(reader)
            reader.skip_tags()
            coordinators.append((node, chost, cport, error))
    if coordinators:
        refuse_if_unauthorized(coordinators[0][3], f"finding the coordinator of group {group!r}")
    if not coordinators or coordinators[0][3]:
        raise ConnectionError(
            f"no coordinator for group {group!r} (error {coordinators[0][3] if coordinators else '?'})"
        )
    _, chost, cport, _ = coordinators[0]
    return chost, cport


def share_partition_offsets(
    settings: Mapping[str, str], group: str, topic: str, partitions: list[int], timeout: float = 5.0
) -> dict[int, tuple[int | None, int | None]]:
    """(start offset, lag) per partition (DescribeShareGroupOffsets v1, KIP-1226, Kafka 4.2+).

    The start offset is the oldest record the group has not finished. (None, None) where the
    broker holds no state for the partition (the group never fetched from it); a lag of None
    where the broker reports none (-1).
    """
    chost, cport = _group_coordinator(settings, group, timeout)
    partition_items = [struct.pack(">i", p) for p in partitions]
    topic_item = compact_string(topic) + _compact_array(partition_items) + uvarint(0)
    group_item = compact_string(group) + _compact_array([topic_item]) + uvarint(0)
    with _FlexibleClient(chost, cport, settings, timeout) as client:
        reader = client.request(DESCRIBE_SHARE_GROUP_OFFSETS_KEY, 1, _compact_array([group_item]) + uvarint(0))
    reader.int32()  # throttle
    offsets: dict[int, tuple[int | None, int | None]] = {}
    for _ in range(reader.uvarint() - 1):
        reader.compact_string()
        for _ in range(reader.uvarint() - 1):
            reader.compact_string()
            reader.take(16)  # topic id
            for _ in range(reader.uvarint() - 1):
                index, start, _epoch, lag, error = (
                    reader.int32(),
                    reader.int64(),
                    reader.int32(),
                    reader.int64(),
                    reader.int16(),
                )
                _nullablecompact_string(reader)
                reader.skip_tags()
                refuse_if_unauthorized(error, f"reading group {group!r}'s offsets of {topic!r}")
                known = error == 0 and start >= 0
                offsets[index] = (start if known else None, lag if known and lag >= 0 else None)
            reader.skip_tags()
        group_error = reader.int16()
        message = _nullablecompact_string(reader)
        reader.skip_tags()
        refuse_if_unauthorized(group_error, f"reading group {group!r}'s offsets")
        if group_error:
            raise ConnectionError(
                f"DescribeShareGroupOffsets failed for {group!r}: error {group_error} {message or ''}"
            )
    return offsets


@dataclass(frozen=True)
class ShareMember:
    client_id: str
    client_host: str
    partitions: tuple[int, ...]  # of the described topic


@dataclass(frozen=True)
class ShareGroup:
    state: str  # Empty, Stable, Dead, ... ("Dead" when the group does not exist)
    members: tuple[ShareMember, ...]


def describe_share_group(settings: Mapping[str, str], group: str, topic: str, timeout: float = 5.0) -> ShareGroup:
    """A share group's state and members, with each member's partitions of ``topic`` (ShareGroupDescribe v1)."""
    chost, cport = _group_coordinator(settings, group, timeout)
    body = _compact_array([compact_string(group)]) + b"\x00" + uvarint(0)  # no authorized operations
    with _FlexibleClient(chost, cport, settings, timeout) as client:
        reader = client.request(SHARE_GROUP_DESCRIBE_KEY, 1, body)
    reader.int32()  # throttle
    described: ShareGroup | None = None
    for _ in range(reader.uvarint() - 1):
        error, message = reader.int16(), _nullablecompact_string(reader)
        reader.compact_string()  # group id
        state = reader.compact_string()
        reader.int32(), reader.int32()  # group and assignment epochs
        reader.compact_string()  # assignor
        members = []
        for _ in range(reader.uvarint() - 1):
            reader.compact_string()  # member id
            _nullablecompact_string(reader)  # rack
            reader.int32()  # member epoch
            client_id, client_host = reader.compact_string(), reader.compact_string()
            for _ in range(reader.uvarint() - 1):
                reader.compact_string()  # subscribed topic
            partitions: list[int] = []
            for _ in range(reader.uvarint() - 1):
                reader.take(16)  # topic id
                name = reader.compact_string()
                assigned = [reader.int32() for _ in range(reader.uvarint() - 1)]
                reader.skip_tags()
                if name == topic:
                    partitions += assigned
            reader.skip_tags()  # assignment
            reader.skip_tags()  # member
            members.append(ShareMember(client_id, client_host, tuple(sorted(partitions))))
        reader.int32()  # authorized operations
        reader.skip_tags()
        if error == GROUP_ID_NOT_FOUND:
            described = ShareGroup("Dead", ())
        elif error:
            refuse_if_unauthorized(error, f"describing group {group!r}")
            raise ConnectionError(f"ShareGroupDescribe failed for {group!r}: error {error} {message or ''}")
        else:
            described = ShareGroup(state, tuple(members))
    if described is None:
        raise ConnectionError(f"ShareGroupDescribe answered nothing for {group!r}")
    return described
