"""How long a failed delivery waits before the next one: the consumer and kmq runtimes' backoff."""

from __future__ import annotations

import random


def retry_delay_ms(attempt: int, backoff_ms: int, max_backoff_ms: int, rng: random.Random | None = None) -> float:
    """Wait after failed ``attempt`` (1-based): exponential from ``backoff_ms``, capped, with jitter.

    The cap doubles each attempt; the wait is drawn from the upper half of it ("equal
    jitter"), so retries of many records spread out, yet never below ``backoff_ms`` nor above
    ``max_backoff_ms``.
    """
    cap = min(float(max_backoff_ms), backoff_ms * 2.0 ** (attempt - 1))
    draw = (rng or random).uniform(cap / 2, cap)
    return min(float(max_backoff_ms), max(float(backoff_ms), draw))
