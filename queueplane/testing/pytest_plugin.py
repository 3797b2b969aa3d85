"""The pytest fixture of the handler author's kit (queueplane.testing).

Load it from a team's conftest.py (``pytest_plugins = ["queueplane.testing.pytest_plugin"]``) or
with ``pytest -p queueplane.testing.pytest_plugin``. ``handler_runner`` makes ``HandlerRunner``s
and closes each one when its test ends, so the spec's ``processing.teardown`` runs then:

    def test_a_poison_order_goes_to_the_dlq(handler_runner):
        runner = handler_runner("specs/cafe/coffee-orders.yaml")
        assert runner.deliver(make_record(b"{not json")).dead_lettered
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from queueplane.testing import HandlerRunner


@pytest.fixture
def handler_runner() -> Iterator[Callable[..., HandlerRunner]]:
    """A factory: ``handler_runner(spec_path, **overrides)`` for a spec's handler, or
    ``handler_runner(handler=callable_or_reference, **settings)`` for a handler alone."""
    made: list[HandlerRunner] = []

    def make(spec: str | Path | None = None, **settings: Any) -> HandlerRunner:
        runner = HandlerRunner.from_spec(spec, **settings) if spec is not None else HandlerRunner(**settings)
        made.append(runner)
        return runner

    yield make
    for runner in reversed(made):
        runner.close()
