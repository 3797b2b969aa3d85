"""A spec's file name is data: Jinja never renders it, whatever braces it holds."""

from __future__ import annotations

import shutil

from helpers import EXAMPLES

from queueplane.operators.dag_factory import queue_dag
from queueplane.operators.provision import switched_on
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


def test_the_trigger_forms_dry_run_reaches_each_switch_and_airflows_dry_run_stays_a_method(airflow_db):
    spec = str(EXAMPLES / "cafe" / "coffee-orders.yaml")
    for dry in (True, False):
        dag = queue_dag(steps.validate([spec])[0])
        switched = {}
        for task in dag.tasks:
            task.render_template_fields({"params": {"dry_run": dry, "deploy": True}})
            if hasattr(task, "dry_run_switch"):
                switched[task.task_id] = switched_on(task.dry_run_switch)
            task.dry_run()  # BaseOperator's: logs each templated field as rendered
        assert switched == {"apply_topics": dry, "apply_group_configs": dry, "deploy": dry}
