"""The KMQ pattern: start and end markers in a markers topic, and a redelivery tracker that brings
back what was started and never ended; queue semantics on any Kafka version. The driver half is
here (``runtime.py``, ``source.py``, the tracker and its redeliverer), with the marker format both
halves use (``markers.py``); what runs in the processes is under ``executor/``."""
