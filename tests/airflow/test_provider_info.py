"""queueplane as an Airflow provider: the dict its entry point returns, checked by this Airflow's own schema."""

from __future__ import annotations

import importlib
import json
from importlib import metadata, resources

import jsonschema

import queueplane
import queueplane.operators as operators
from queueplane.operators.provider import get_provider_info


def test_provider_info_validates_against_the_installed_airflows_schema():
    schema = json.loads(resources.files("airflow").joinpath("provider_info.schema.json").read_text())
    info = get_provider_info()
    jsonschema.validators.validator_for(schema)(schema).validate(info)
    assert info["package-name"] == metadata.metadata("queueplane")["Name"]
    assert info["versions"] == [queueplane.__version__]
    assert "connection-types" not in info  # queueplane defines no hook class with a conn_type
    integrations = {i["integration-name"] for i in info["integrations"]}
    for kind in ("operators", "sensors", "hooks"):
        for entry in info[kind]:
            assert entry["integration-name"] in integrations
            for module in entry["python-modules"]:
                importlib.import_module(module)


def test_every_operator_and_sensor_lives_in_a_module_the_provider_lists():
    from airflow.sdk import BaseSensorOperator

    info = get_provider_info()
    listed = {kind: {m for e in info[kind] for m in e["python-modules"]} for kind in ("operators", "sensors")}
    for name in operators.__all__:
        cls = getattr(operators, name)
        kind = "sensors" if issubclass(cls, BaseSensorOperator) else "operators"
        assert cls.__module__ in listed[kind], (name, cls.__module__)


def test_the_installed_distribution_declares_the_provider_entry_point():
    (entry,) = [e for e in metadata.entry_points(group="apache_airflow_provider") if e.dist.name == "queueplane"]
    assert entry.value == "queueplane.operators.provider:get_provider_info"
    assert entry.load() is get_provider_info
