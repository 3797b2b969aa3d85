"""A Kafka connection's OAuth callback, named by dotted path in the connection's extra."""

from __future__ import annotations

import os
import time


def token(config: str) -> tuple[str, float]:
    """librdkafka asks for a token before it connects; the test sees that it asked, and with what."""
    with open(os.environ["QUEUEPLANE_TEST_OAUTH_LOG"], "a", encoding="utf-8") as log:
        log.write(config + "\n")
    return "not-a-real-token", time.time() + 60
