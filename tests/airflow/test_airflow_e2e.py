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
from airflow_stack import AirflowStack
from airflow_support import kafka_connection
from helpers import REPO, tagged_examples, unique_tag

from queueplane.kafka import clients

pytestmark = pytest.mark.kafka

DAG_ID = "queue__cafe__coffee-orders"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"  # Debian's package; `make test` installs it
SCREENSHOT = REPO / "tests" / "results" / "airflow-trigger.png"


@pytest.fixture(scope="module")
def airflow(tmp_path_factory, kafka) -> Iterator[tuple[AirflowStack, str]]:
    home = tmp_path_factory.mktemp("airflow-e2e")
    tag = unique_tag()
    tagged_examples(home / "specs", tag)
    stack = AirflowStack.create(
        home,
        {
            "QUEUEPLANE_SPECS_DIR": str(home / "specs"),
            "QUEUEPLANE_HOME": str(home / "queueplane"),
            "AIRFLOW_CONN_KAFKA_DEFAULT": kafka_connection(kafka),
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
