"""The time-slice source of a kmq queue's members: the consumer groups' source (consumer/source.py)
with kmq's members (member.py) and settings."""

from __future__ import annotations

from queueplane.run.consumer.source import MemberSource, MemberStreamReader
from queueplane.run.kmq.executor.member import MEMBERS
from queueplane.run.kmq.executor.tasks import KmqSettings


class KmqStreamReader(MemberStreamReader):
    members = MEMBERS  # type: ignore[assignment]
    settings_type = KmqSettings


class KmqMemberSource(MemberSource):
    stream_reader_type = KmqStreamReader
