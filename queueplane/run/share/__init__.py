"""Share groups (KIP-932): a Spark source of time slices over long-lived ShareConsumers, a handler
pool per Python worker process, per-record ACCEPT / RELEASE / REJECT after outputs are durable.
The driver half is here (``runtime.py``, ``source.py``, ``settings.py``); what runs in the
processes is under ``executor/``."""
