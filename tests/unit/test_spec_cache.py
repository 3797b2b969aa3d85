"""Re-checks of unchanged specs reuse earlier verdicts, and never hide a problem."""

from __future__ import annotations

from pathlib import Path

import pytest
from specs_factory import dump, spec

from queueplane.provision import steps
from queueplane.spec.cache import SpecCache


@pytest.fixture(autouse=True)
def own_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUEUEPLANE_HOME", str(tmp_path / "home"))


def _write(path: Path, doc: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump(doc))
    return path


def test_unchanged_files_are_not_checked_again_and_give_the_same_queues(tmp_path):
    _write(tmp_path / "specs" / "a.yaml", spec("share"))
    _write(tmp_path / "specs" / "b.yaml", spec("kmq"))
    first = steps.check_specs([str(tmp_path / "specs")])
    assert SpecCache().lookup(str(tmp_path / "specs" / "a.yaml"), "0" * 64) is None
    cache = SpecCache()
    assert len(cache.entries) == 2
    second = steps.check_specs([str(tmp_path / "specs")])
    assert second.queues == first.queues and second.problems == []


def test_an_edited_file_is_checked_again(tmp_path):
    path = _write(tmp_path / "specs" / "a.yaml", spec("share"))
    assert steps.check_specs([str(path)]).problems == []
    broken = spec("share")
    broken["spec"]["group"]["ordering"] = "key"
    _write(path, broken)
    (problem,) = steps.check_specs([str(path)]).problems
    assert problem.pointer == "/spec/group/ordering"
    assert str(path) not in SpecCache().entries, "a failing file must leave the cache"


def test_rules_across_specs_still_run_when_every_file_is_cached(tmp_path):
    a = _write(tmp_path / "one" / "a.yaml", spec("share"))
    b = _write(tmp_path / "two" / "b.yaml", spec("share"))
    assert steps.check_specs([str(a)]).problems == []
    assert steps.check_specs([str(b)]).problems == []
    both = steps.check_specs([str(a), str(b)])
    assert {p.pointer for p in both.problems} >= {"/metadata/name", "/spec/group/id", "/spec/topic/name"}


def test_a_changed_checker_drops_the_cache(tmp_path, monkeypatch):
    path = _write(tmp_path / "a.yaml", spec("consumer"))
    steps.check_specs([str(path)])
    assert SpecCache().entries
    import queueplane.spec.cache as spec_cache

    monkeypatch.setattr(spec_cache, "code_fingerprint", lambda: "another version of the rules")
    assert SpecCache().entries == {}
