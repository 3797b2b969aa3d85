"""A spec's file name is data: Jinja never renders it, whatever braces it holds."""

from __future__ import annotations

import shutil

from helpers import EXAMPLES

from queueplane.operators.dag_factory import queue_dag
from queueplane.provision import steps


def test_a_spec_path_with_template_syntax_reaches_every_task_as_written(airflow_db, tmp_path):
    folder = tmp_path / "{{ 7 * 7 }}" / "{% for x in range(3) %}x{% endfor %}"
    folder.mkdir(parents=True)
    spec = folder / "coffee-orders.yaml"
    shutil.copy(EXAMPLES / "cafe" / "coffee-orders.yaml", spec)
    dag = queue_dag(steps.validate([str(spec)])[0])
    context = {"params": {"dry_run": False, "deploy": True}}
    for task in dag.tasks:
        task.render_template_fields(context)
        assert task.spec_path == str(spec.resolve()), task.task_id
    written = str(spec.relative_to(tmp_path))  # the temporary folder's own name may hold "49"
    assert written.startswith("{{ 7 * 7 }}/{% for") and "49" not in written and "xxx" not in written
