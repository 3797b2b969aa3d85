"""Consumer groups: each Python worker process a member of the group, leased by a time-slice
source; ordered per partition or per key, retries in place, offsets committed only past finished
records, exactly-once output with KIP-447 transactions. The driver half is here (``runtime.py``,
``source.py``); what runs in the processes is under ``executor/``."""
