"""Run: the PySpark worker of a queue, in rooms by where the code runs.

- ``driver/``: the Spark driver's side: the application, one queue's run, scaling, status,
  metrics and health, and ``QueueRuntime``, the interface each group type implements there.
- ``executor/``: what runs in the executors' Python worker processes for every group type:
  what a process keeps between tasks, handler calls, the crash journal and the guards.
- ``spark/``: Spark set-up: the session, its Python daemon and interpreter, the Kafka connector.
- ``share/``, ``consumer/``, ``kmq/``: one folder per group type; its driver half at the top
  (``runtime.py``, the Spark source, what the driver tells processes), its process half under
  ``executor/``.
- Here: what both halves read and write: the settings the driver sends (``settings.py``),
  outcome rows (``outcomes.py``), dead-letter records (``dead_letters.py``) and the fates of
  dead letters the DLQ refuses (``parking.py``).

Nothing here imports pyspark or pyarrow at package import: every Python worker process imports
this package before its first task."""
