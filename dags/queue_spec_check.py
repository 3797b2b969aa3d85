"""Airflow import error for every queue spec with a problem (file, JSON pointer, message).

This file defines no DAG: it only fails to import while a spec under specs/ is invalid,
so the Airflow UI lists the problems while the other queues' DAGs keep loading.
"""

from pathlib import Path

from queueplane.operators.dag_factory import raise_spec_problems, specs_dir

raise_spec_problems(specs_dir(Path(__file__).resolve().parent.parent / "specs"))
