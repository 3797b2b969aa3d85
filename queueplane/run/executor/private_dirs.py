"""The directories a queue's processes on one machine share their state in, private to the user running them.

The crash journal (queueplane.run.executor.crash_journal) and the share outboxes
(queueplane.run.share.executor.outbox) decide which records count as crashed and which as accepted from
files that every Python worker process of a queue on the machine reads. On a host with other
users (local mode, spark-submit nodes, executors that serve several queues), a directory under a
predictable shared path could have been made by one of them first: whatever it planted there
would be read as the queue's own. So each directory the project uses here is made mode 0700, and
each time it is opened it is checked through a descriptor opened with ``O_NOFOLLOW``: a real
directory (a symbolic link is refused, not followed), owned by this process's effective uid,
with no permission bit for its group or for others. A directory that fails is refused with a
one-paragraph ``PrivateDirRefused`` that names it and says what to do; it is never repaired or
used as it is, since what it already holds may be another user's.

The root is ``QUEUEPLANE_CALLS_DIR`` when set (an absolute path, checked the same way), else
``$XDG_RUNTIME_DIR/queueplane`` when the session has a runtime directory of this user's, else
``<tempdir>/queueplane-<uid>``. Inside the root each queue has a folder of its own
(``queue_folder``). Once the root is checked, nothing inside it can be another user's: only its
owner (and root) may create, rename or remove entries there. The directory holding the root is
not checked: the shared temporary directory is sticky (others cannot rename or remove an entry
of this user's), and a pod's ``/tmp`` is an emptyDir that only the pod's own user writes.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

from queueplane.errors import QueueplaneError, one_line

ROOT_SETTING = "QUEUEPLANE_CALLS_DIR"
PRIVATE_MODE = 0o700
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class PrivateDirRefused(QueueplaneError):
    """A directory for a queue's private state exists but is not private to this user (or cannot be made)."""


def calls_root() -> tuple[Path, str]:
    """The root of every queue's folders on this machine, and how it was chosen (for errors)."""
    override = os.environ.get(ROOT_SETTING)
    if override:
        if not os.path.isabs(override):  # Spark's Python workers run in folders of their own
            raise PrivateDirRefused(
                one_line(
                    f"{ROOT_SETTING}={override} is a relative path, which each process of the worker would "
                    "find somewhere else: set it to an absolute path"
                )
            )
        return Path(override), f"{ROOT_SETTING}={override}"
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime) and _is_private(Path(runtime)):
        return Path(runtime) / "queueplane", f"the default under XDG_RUNTIME_DIR={runtime}"
    return Path(tempfile.gettempdir()) / f"queueplane-{os.geteuid()}", f"the default; {ROOT_SETTING} moves it"


def queue_folder(group_id: str) -> Path:
    """The queue's private folder on this machine, made (0700) and checked, with the root above it."""
    root, chosen = calls_root()
    private_dir(root, chosen)
    name = group_id.replace("/", "_")
    if name in ("", ".", ".."):
        name = f"_{name}"
    return private_dir(root / name, f"the folder of group {group_id!r} under {root}")


def private_dir(path: Path, what: str = "a queue's private folder") -> Path:
    """``path``, made a directory of mode 0700 if it is not there; PrivateDirRefused unless it is a
    directory (not a link to one) of this process's effective uid that no one else may use.

    ``what`` says where the path came from, for the error (a setting names itself there).
    """
    created = True
    try:
        os.mkdir(path, PRIVATE_MODE)
    except FileExistsError:
        created = False
    except OSError as exc:
        raise _refused(path, what, f"cannot be created ({exc.strerror})", _FIX_CREATE) from None
    try:
        fd = os.open(path, _OPEN_DIR)
    except OSError as exc:
        raise _refused(path, what, *_unopenable(path, exc)) from None
    try:
        if created:
            os.fchmod(fd, PRIVATE_MODE)  # exactly 0700, whatever the umask took away
        info = os.fstat(fd)
    finally:
        os.close(fd)
    uid = os.geteuid()
    if info.st_uid != uid:
        raise _refused(
            path,
            what,
            f"is owned by uid {info.st_uid}, not by uid {uid} that runs this worker: another user may "
            "have made it to plant files in it",
            _FIX_FOREIGN,
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        raise _refused(
            path,
            what,
            f"has mode {mode & 0o777:04o}: its group or others may use it, and what it holds may not be this "
            "user's alone (it must be 0700)",
            _FIX_FOREIGN,
        )
    return path


_FIX_CREATE = f"set {ROOT_SETTING} to a directory this user may write in"
_FIX_FOREIGN = (
    f"remove it (the worker makes it anew, 0700), or set {ROOT_SETTING} to a directory of this user's with mode 0700"
)


def _unopenable(path: Path, exc: OSError) -> tuple[str, str]:
    """Why an existing path cannot be opened as a directory without following a link, and what to do."""
    try:
        info = os.lstat(path)
    except OSError:
        return f"cannot be opened ({exc.strerror})", _FIX_CREATE
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link, which is not followed: it could lead this worker's files anywhere", _FIX_FOREIGN
    if not stat.S_ISDIR(info.st_mode):
        return "is not a directory", _FIX_FOREIGN
    if exc.errno == errno.EACCES:
        return "cannot be opened (permission denied)", _FIX_FOREIGN
    return f"cannot be opened ({exc.strerror})", _FIX_CREATE


def _refused(path: Path, what: str, problem: str, fix: str) -> PrivateDirRefused:
    return PrivateDirRefused(
        one_line(
            f"{path} ({what}) {problem}. The worker keeps its crash journal and outboxes there and "
            f"uses no directory another user could have written in: {fix}."
        )
    )


def _is_private(path: Path) -> bool:
    """Whether ``path`` is a directory of this user's that no one else may use (a runtime directory's promise)."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not stat.S_IMODE(info.st_mode) & 0o077
