"""Airflow DAGs: one per queue spec under specs/ (or $QUEUEPLANE_SPECS_DIR).

Commit a spec and its DAG `queue__<team>__<name>` appears. Specs with problems are left
out here and reported by queue_spec_check.py as an import error.
"""

from pathlib import Path

from queueplane.operators.dag_factory import queue_dags, specs_dir

globals().update(queue_dags(specs_dir(Path(__file__).resolve().parent.parent / "specs")))
