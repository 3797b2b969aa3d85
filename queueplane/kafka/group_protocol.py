"""Which consumer-group protocol the cluster has: KIP-848's ``consumer``, else ``classic``.

A broker that serves ConsumerGroupHeartbeat (API key 68) runs the consumer protocol's group
coordinator; its members get their assignments from the broker, one partition move at a time.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping
from typing import Any

from queueplane.kafka.connection import connect
from queueplane.kafka.wire import Reader, compact_string, recv_exact, uvarint

log = logging.getLogger("queueplane.worker")

API_VERSIONS_KEY = 18
CONSUMER_GROUP_HEARTBEAT_KEY = 68
CONSUMER, CLASSIC = "consumer", "classic"


def _first_server(settings: Mapping[str, str]) -> tuple[str, int]:
    first = settings.get("bootstrap.servers", "").split(",")[0].strip()
    host, _, port = first.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"bootstrap.servers {first!r} is not host:port")
    return host, int(port)


def api_keys(settings: Mapping[str, str], timeout: float = 5.0) -> set[int]:
    """The API keys the first bootstrap server serves (ApiVersions v3, over the clients' security)."""
    host, port = _first_server(settings)
    client_id = b"queueplane"
    header = struct.pack(">hhih", API_VERSIONS_KEY, 3, 1, len(client_id)) + client_id + uvarint(0)
    payload = header + compact_string("queueplane") + compact_string("1") + uvarint(0)
    sock = connect(host, port, settings, timeout)
    try:
        sock.sendall(struct.pack(">i", len(payload)) + payload)
        size = struct.unpack(">i", recv_exact(sock, 4))[0]
        reader = Reader(recv_exact(sock, size))
    finally:
        sock.close()
    reader.int32()  # correlation id; ApiVersions answers with header v0
    error = reader.int16()
    if error:
        raise ConnectionError(f"ApiVersions failed with Kafka error code {error}")
    keys = set()
    for _ in range(reader.uvarint() - 1):
        key, _lo, _hi = reader.int16(), reader.int16(), reader.int16()
        reader.skip_tags()
        keys.add(key)
    return keys


def group_protocol(settings: Mapping[str, str]) -> str:
    """``consumer`` where the broker has KIP-848's group coordinator, ``classic`` otherwise (also
    where queueplane's own requests cannot ask: a classic member joins a group of either kind)."""
    try:
        keys = api_keys(settings)
    except Exception as exc:  # any broker serves classic members
        log.warning("could not ask the broker for its group protocols (%s): members use classic", exc)
        return CLASSIC
    return CONSUMER if CONSUMER_GROUP_HEARTBEAT_KEY in keys else CLASSIC


def protocol_in_use(admin: Any, group: str) -> str | None:
    """The protocol the consumer group runs now (``consumer`` or ``classic``), from the broker's
    description of it; None where the group has no members and no state to tell (or is not there)."""
    described = admin.describe_consumer_groups([group], request_timeout=10)[group].result()
    state = getattr(described.state, "name", str(described.state or "")).upper()
    if state in ("DEAD", "UNKNOWN"):  # a group the broker does not hold is described as a dead classic one
        return None
    kind = getattr(described, "type", None)
    name = getattr(kind, "name", str(kind or "")).lower()
    return name if name in (CONSUMER, CLASSIC) else None
