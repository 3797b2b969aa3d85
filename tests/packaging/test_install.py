"""The wheel installed as each kind of user installs it, in fresh venvs (packages from PyPI: minutes)."""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import pytest
from helpers import EXAMPLE_SPECS, EXAMPLES, REPO
from packaging.utils import canonicalize_name
from packaging_support import CONSTRAINTS, Venv, pinned_versions, wheel_requirements

pytestmark = pytest.mark.packaging

# An Airflow release other than constraints.txt's, on the extra's floor minor (3.2): the operators must
# import there too. PyPI serves it (pip index versions apache-airflow).
OTHER_AIRFLOW = "3.2.2"
# Airflow's own distributions, which follow the release asked for rather than constraints.txt.
AIRFLOW_ITSELF = {"apache-airflow", "apache-airflow-core", "apache-airflow-task-sdk"}


def test_wheel_carries_license_py_typed_schema_chart_worker_script_and_provider_entry_point(wheel: Path):
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
        dist_info = next(n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info"))
        metadata = whl.read(f"{dist_info}/METADATA").decode()
        entry_points = whl.read(f"{dist_info}/entry_points.txt").decode()
    assert f"{dist_info}/licenses/LICENSE" in names
    assert "License-Expression: Apache-2.0" in metadata
    assert "queueplane/py.typed" in names
    assert "queueplane/_data/specs/queue-v1.schema.json" in names
    assert "queueplane/_data/charts/queue-worker/Chart.yaml" in names
    assert "queueplane/_data/spark_apps/queue_worker.py" in names, "the spark-submit target submits it"
    assert "[apache_airflow_provider]\nprovider_info = queueplane.operators.provider:get_provider_info" in entry_points
    assert "Project-URL: Source, https://github.com/queueplane/queueplane" in metadata


def test_core_alone_runs_validate(wheel: Path, venv: Venv):
    venv.pip_install("-c", CONSTRAINTS, wheel)

    absent = venv.python(
        "import importlib.util, json\n"
        "def found(name):\n"
        "    try:\n"
        "        return importlib.util.find_spec(name) is not None\n"
        "    except ModuleNotFoundError:\n"
        "        return False\n"
        "names = ['pyspark', 'pyarrow', 'pandas', 'numpy', 'google.protobuf', 'airflow', 'kubernetes']\n"
        "print(json.dumps([n for n in names if found(n)]))\n"
    )
    assert json.loads(absent.stdout) == []

    result = venv.run(venv.bin("queueplane"), "validate", REPO / "specs")
    examples = EXAMPLE_SPECS
    assert examples
    for name in examples:
        assert f"ok  {name}" in result.stdout, result.stdout
    assert f"{len(examples)} spec(s) valid" in result.stdout

    # The worker is an extra: without it, `run` says which install it needs, in one line.
    run = subprocess.run(
        [venv.bin("queueplane"), "run", EXAMPLES / "cafe" / "coffee-orders.yaml", "--bootstrap-servers", "127.0.0.1:9"],
        cwd=venv.work,
        env=venv.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2, run.stderr
    assert "pip install 'queueplane[worker]'" in run.stderr and "Traceback" not in run.stderr


def test_airflow_extra_imports_operators_beside_another_airflow_patch(wheel: Path, venv: Venv):
    pins = pinned_versions()
    assert pins["apache-airflow"] != OTHER_AIRFLOW
    # queueplane's own requirements (core and the airflow extra) stay on constraints.txt's versions;
    # Airflow and what that release needs are resolved for it, as in a team's own Airflow deployment.
    own = {
        canonicalize_name(req.name)
        for req in wheel_requirements(wheel)
        if req.marker is None or req.marker.evaluate({"extra": "airflow"})
    }
    constraints = venv.work / "constraints-queueplane.txt"
    constraints.write_text("".join(f"{name}=={pins[name]}\n" for name in sorted(own - AIRFLOW_ITSELF)))
    venv.pip_install("-c", constraints, f"apache-airflow=={OTHER_AIRFLOW}", f"{wheel}[airflow]")

    imported = venv.python(
        "import json, airflow, queueplane, queueplane.operators as ops\n"
        "import queueplane.operators.dag_factory, queueplane.operators.hooks\n"
        "from airflow.sdk import BaseOperator, BaseSensorOperator\n"
        "classes = {name: getattr(ops, name) for name in ops.__all__}\n"
        "print(json.dumps({'airflow': airflow.__version__, 'queueplane': queueplane.__file__,\n"
        "    'operators': sorted(n for n, c in classes.items() if issubclass(c, BaseOperator)),\n"
        "    'sensors': sorted(n for n, c in classes.items() if issubclass(c, BaseSensorOperator))}))\n"
    )
    seen = json.loads(imported.stdout)
    assert seen["airflow"] == OTHER_AIRFLOW
    assert seen["queueplane"].startswith(str(venv.root))
    assert seen["operators"] == sorted(
        [
            "ApplyGroupConfigsOperator",
            "ApplyTopicsOperator",
            "HelmDeployOperator",
            "PlanQueueOperator",
            "QueueReadySensor",
            "RemoveQueuesOperator",
            "SparkDriverReadySensor",
            "SparkSubmitDeployOperator",
            "ValidateSpecOperator",
        ]
    )
    assert seen["sensors"] == ["QueueReadySensor", "SparkDriverReadySensor"]

    listed = venv.run(venv.bin("airflow"), "providers", "list", "-o", "json")
    providers = {p["package_name"]: p for p in json.loads(listed.stdout)}
    assert providers["queueplane"]["version"] == "0.1.0"
