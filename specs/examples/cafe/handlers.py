"""The barista service's handler for the coffee-orders queue (the demo's example handler)."""

from __future__ import annotations

import time

from queueplane import Output, Record, Reject

MENU = {"espresso", "flat white", "cappuccino", "latte", "mocha", "cortado", "americano"}


def prepare_drink(record: Record) -> Output:
    order = record.json()  # an order that is not JSON can never be made: Reject (DLQ)
    if order.get("drink") not in MENU:
        raise Reject(f"not on the menu: {order.get('drink')!r}")
    if order.get("slow"):
        time.sleep(0.2)  # milk that needs steaming
    return Output({"id": order["id"], "drink": order["drink"], "status": "ready"}, key=record.key)
