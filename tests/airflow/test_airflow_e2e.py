"""End to end: a real Airflow (api-server, scheduler, dag-processor) runs a spec's DAG.

Once through the REST API v2, once by a person's clicks in headless Chromium: open the
DAG page, Trigger, confirm, watch the run succeed. The topics exist on the real broker
afterwards. The screenshot lands in tests/results/airflow-trigger.png.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from urllib.parse import unquote

import pytest
from airflow_stack import DAGS, AirflowStack
from airflow_support import kafka_connection
from helpers import REPO, tagged_examples, unique_tag

from queueplane.kafka import clients

pytestmark = pytest.mark.kafka

DAG_ID = "queue__cafe__coffee-orders"
DOWNSTREAM_ID = "cafe_menu_on_orders_provisioned"
DOWNSTREAM = f"""
from airflow.sdk import DAG, Asset
from airflow.providers.standard.operators.empty import EmptyOperator

with DAG("{DOWNSTREAM_ID}", schedule=[Asset("{{uri}}")], start_date=None, catchup=False):
    EmptyOperator(task_id="publish_menu")
"""
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"  # Debian's package; `make test` installs it
SCREENSHOT = REPO / "tests" / "results" / "airflow-trigger.png"


@pytest.fixture(scope="module")
def airflow(tmp_path_factory, kafka) -> Iterator[tuple[AirflowStack, str]]:
    home = tmp_path_factory.mktemp("airflow-e2e")
    tag = unique_tag()
    tagged_examples(home / "specs", tag)
    # queueplane's DAG files, and a team's DAG that waits for the coffee-orders topic to be provisioned.
    dags = home / "dags"
    shutil.copytree(DAGS, dags, ignore=shutil.ignore_patterns("__pycache__"))
    (dags / "downstream.py").write_text(DOWNSTREAM.format(uri=f"kafka://{kafka.bootstrap}/{tag}.cafe.coffee-orders.v1"))
    stack = AirflowStack.create(
        home,
        {
            "QUEUEPLANE_SPECS_DIR": str(home / "specs"),
            "QUEUEPLANE_HOME": str(home / "queueplane"),
            "AIRFLOW_CONN_KAFKA_DEFAULT": kafka_connection(kafka),
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        },
    )
    try:
        stack.start()
        stack.wait_for(lambda: stack.api("GET", f"/dags/{DAG_ID}")[0] == 200, f"the DAG {DAG_ID} to appear", 240)
        yield stack, tag
    finally:
        stack.stop()


def _topics(kafka) -> set[str]:
    return set(clients.admin(kafka.settings).list_topics(timeout=10).topics)


def test_trigger_through_the_rest_api(airflow, kafka):
    stack, tag = airflow
    status, errors = stack.api("GET", "/importErrors")
    assert status == 200 and errors["total_entries"] == 0, errors

    status, run = stack.api("POST", f"/dags/{DAG_ID}/dagRuns", {"logical_date": None, "conf": {"deploy": False}})
    assert status == 200, run
    finished = stack.wait_for_run(DAG_ID, run["dag_run_id"])

    states = stack.task_states(DAG_ID, run["dag_run_id"])
    assert finished["state"] == "success", (states, stack.log_tail("scheduler"))
    assert states["apply_topics"] == "success" and states["deploy"] == "skipped"
    assert {f"{tag}.cafe.coffee-orders.v1", f"{tag}.cafe.coffee-orders.v1.dlq"} <= _topics(kafka)

    # The topic's asset, published by apply, schedules the team's downstream DAG.
    def downstream_runs() -> list[dict]:
        status, body = stack.api("GET", f"/dags/{DOWNSTREAM_ID}/dagRuns")
        return body["dag_runs"] if status == 200 else []

    (triggered,) = stack.wait_for(downstream_runs, f"a run of {DOWNSTREAM_ID}", 120)
    assert triggered["run_type"] == "asset_triggered", triggered


def test_trigger_by_clicking_in_the_ui(airflow, kafka):
    from playwright.sync_api import expect, sync_playwright

    stack, tag = airflow
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(f"{stack.url}/dags/{DAG_ID}")
            page.get_by_role("button", name="Trigger Dag").click()
            dialog = page.get_by_role("dialog")
            expect(dialog.get_by_text("Run Parameters")).to_be_visible()
            expect(dialog.locator("[name=element_deploy]")).to_be_checked()
            dialog.get_by_role("button", name="Trigger", exact=True).click()

            page.wait_for_url(re.compile(rf"/dags/{DAG_ID}/runs/[^/]+"), timeout=60_000)
            run_id = unquote(page.url.split("/runs/")[1].split("/")[0].split("?")[0])
            finished = stack.wait_for_run(DAG_ID, run_id)
            states = stack.task_states(DAG_ID, run_id)
            assert finished["state"] == "success", states
            assert states["deploy"] == "skipped"  # no kubernetes_default: rendered, validated, skipped
            page.reload()
            expect(page.get_by_text("Success", exact=True).first).to_be_visible(timeout=30_000)
            expect(page.get_by_text("Skipped", exact=True).first).to_be_visible()  # deploy: no Kubernetes here
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOT))
        finally:
            browser.close()
    assert SCREENSHOT.stat().st_size > 10_000
    assert f"{tag}.cafe.coffee-orders.v1" in _topics(kafka)
