"""The payments team's ledger poster for the payment-events queue (an example handler).

An event is JSON: the order's ``id`` and, optionally, its ``type`` (AUTHORIZED, CAPTURED or
REFUNDED) and ``amount`` in cents. `queueplane load` sends coffee orders, which carry no type:
they post as AUTHORIZED at the price of their ``size``. The queue orders records per key, so
a REFUNDED entry is never posted before the CAPTURED entry of the same order; with
``exactlyOnce`` each entry is written once, whatever fails.
"""

from __future__ import annotations

import time

from queueplane import Output, Record, Reject

TYPES = ("AUTHORIZED", "CAPTURED", "REFUNDED")
PRICE_CENTS = {"small": 300, "medium": 380, "large": 450}


def post_entry(record: Record) -> Output:
    event = record.json()  # not JSON: Reject, straight to the DLQ
    kind = event.get("type", "AUTHORIZED")
    if kind not in TYPES:
        raise Reject(f"unknown payment event type {kind!r}")
    amount = event.get("amount", PRICE_CENTS.get(event.get("size"), 0))
    if event.get("slow"):
        time.sleep(0.05)  # the ledger database is busy
    sign = -1 if kind == "REFUNDED" else 1
    return Output({"order": event["id"], "type": kind, "amount_cents": sign * amount}, key=record.key)
