"""Airflow DAG queueplane__reconcile: plans every spec on a schedule and fails on drift."""

from pathlib import Path

from queueplane.operators.dag_factory import reconcile_dag, specs_dir

dag = reconcile_dag(specs_dir(Path(__file__).resolve().parent.parent / "specs"))
