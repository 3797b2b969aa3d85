"""The messaging team's mail sender for the email-jobs queue (an example handler).

A job is JSON with a recipient (``to``) or, as in `queueplane load`'s records, a ``customer``
whose address is derived. A job without a recipient can never be sent: Reject, to the DLQ.
A slow job stands for the mail provider stalling; a stall longer than ``lockDuration`` is
given up and the tracker delivers the job again, to any worker.
"""

from __future__ import annotations

import time

from queueplane import Record, Reject


def send_email(record: Record) -> None:
    job = record.json()  # not JSON: Reject, straight to the DLQ
    recipient = job.get("to") or (f"{job['customer']}@example.com" if job.get("customer") else None)
    if not recipient or "@" not in recipient:
        raise Reject("the job names no recipient")
    if job.get("slow"):
        time.sleep(0.2)  # the mail provider is slow to answer
    # Returning accepts the job: the provider has taken the mail (no output record).
