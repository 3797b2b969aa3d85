"""Which consumer-group protocol the cluster has: KIP-848's ``consumer``, else ``classic``.

A broker that serves ConsumerGroupHeartbeat (API key 68) runs the consumer protocol's group
coordinator; its members get their assignments from the broker, one partition move at a time.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from queueplane.kafka.protocol import api_versions, first_server

log = logging.getLogger("queueplane.worker")

CONSUMER_GROUP_HEARTBEAT_KEY = 68
CONSUMER, CLASSIC = "consumer", "classic"


def api_keys(settings: Mapping[str, str], timeout: float = 5.0) -> set[int]:
    """The API keys the first bootstrap server serves (ApiVersions, over the clients' security)."""
    return set(api_versions(*first_server(settings), timeout=timeout, settings=settings).api_ranges)


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
