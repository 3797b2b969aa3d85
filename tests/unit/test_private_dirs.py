"""A queue's folders on a machine (queueplane.run.executor.private_dirs): made 0700, and refused when another
user made them, may write in them, or put a symbolic link in their place."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest

from queueplane.run.executor.crash_journal import journal_folder
from queueplane.run.executor.private_dirs import ROOT_SETTING, PrivateDirRefused, private_dir

ANOTHER_UID = 12345  # another user of the machine (the tests run as root, who may give files away)


@pytest.fixture
def temp(tmp_path, monkeypatch) -> Path:
    """The machine's temporary directory, here; no root set by the environment."""
    monkeypatch.delenv(ROOT_SETTING, raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _refused(group: str = "kitchen") -> str:
    with pytest.raises(PrivateDirRefused) as refused:
        journal_folder(group)
    message = str(refused.value)
    assert "\n" not in message, "one line"
    return message


@pytest.mark.parametrize("umask", [0o000, 0o277])
def test_the_default_root_is_the_users_own_and_every_folder_is_made_0700(temp, umask):
    old = os.umask(umask)  # the modes are the worker's, whatever the umask lets through or takes away
    try:
        folder = journal_folder("kitchen")
    finally:
        os.umask(old)
    root = temp / f"queueplane-{os.geteuid()}"
    assert folder == root / "kitchen"
    assert (_mode(root), _mode(folder)) == (0o700, 0o700)
    assert journal_folder("kitchen") == folder, "opened again, checked again"


@pytest.mark.parametrize("which", ["root", "queue folder"])
def test_a_folder_made_by_another_user_is_refused(temp, which):
    root = temp / f"queueplane-{os.geteuid()}"
    root.mkdir(mode=0o700)
    planted = root if which == "root" else root / "kitchen"
    planted.mkdir(mode=0o700, exist_ok=True)
    os.chown(planted, ANOTHER_UID, ANOTHER_UID)
    message = _refused()
    assert f"{planted} " in message
    assert f"owned by uid {ANOTHER_UID}" in message
    assert "remove it" in message, "says what to do"


@pytest.mark.parametrize("which", ["root", "queue folder"])
@pytest.mark.parametrize("mode", [0o777, 0o770, 0o705])
def test_a_folder_its_group_or_others_may_use_is_refused(temp, which, mode):
    root = temp / f"queueplane-{os.geteuid()}"
    root.mkdir(mode=0o700)
    shared = root if which == "root" else root / "kitchen"
    shared.mkdir(exist_ok=True)
    shared.chmod(mode)
    message = _refused()
    assert f"{shared} " in message
    assert f"has mode {mode:04o}" in message
    assert _mode(shared) == mode, "refused as it is, not repaired"


@pytest.mark.parametrize("which", ["root", "queue folder"])
def test_a_symlink_in_place_of_a_folder_is_refused_not_followed(temp, which):
    elsewhere = temp / "elsewhere"  # a private folder of this user's, even: a link is refused all the same
    elsewhere.mkdir(mode=0o700)
    root = temp / f"queueplane-{os.geteuid()}"
    if which == "root":
        root.symlink_to(elsewhere)
        link = root
    else:
        root.mkdir(mode=0o700)
        link = root / "kitchen"
        link.symlink_to(elsewhere)
    message = _refused()
    assert f"{link} " in message
    assert "symbolic link" in message
    assert list(elsewhere.iterdir()) == [], "nothing made where it points"


def test_the_root_set_by_the_environment_is_checked_the_same_way(temp, monkeypatch):
    root = temp / "calls"
    root.mkdir()
    root.chmod(0o777)
    monkeypatch.setenv(ROOT_SETTING, str(root))
    message = _refused()
    assert message.startswith(f"{root} ({ROOT_SETTING}={root}) has mode 0777")

    root.chmod(0o700)
    assert journal_folder("kitchen") == root / "kitchen"


def test_a_relative_root_set_by_the_environment_is_refused(temp, monkeypatch):
    monkeypatch.chdir(temp)
    monkeypatch.setenv(ROOT_SETTING, "calls")
    message = _refused()
    assert message.startswith(f"{ROOT_SETTING}=calls is a relative path")
    assert not (temp / "calls").exists()


def test_a_runtime_directory_of_the_users_own_holds_the_root(temp, monkeypatch):
    runtime = temp / "run-user"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert journal_folder("kitchen") == runtime / "queueplane" / "kitchen"

    os.chown(runtime, ANOTHER_UID, ANOTHER_UID)  # inherited from another user's session (su)
    assert journal_folder("kitchen") == temp / f"queueplane-{os.geteuid()}" / "kitchen"


def test_a_group_id_cannot_lead_out_of_the_root(temp):
    root = temp / f"queueplane-{os.geteuid()}"
    assert journal_folder("..") == root / "_.."
    assert journal_folder("a/../b") == root / "a_.._b"


def test_a_file_in_place_of_a_folder_is_refused(temp):
    planted = temp / "planted"
    planted.write_text("")
    with pytest.raises(PrivateDirRefused, match="is not a directory"):
        private_dir(planted)
