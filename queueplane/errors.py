"""User-facing errors.

Every problem a user can cause is reported as one line naming the file and the JSON
pointer of the field, so that a run can list all of them at once and an editor or CI
annotation can jump to the spot. Exit codes are shared by every command.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def one_line(text: str) -> str:
    """Escape control characters (a YAML key can hold a newline) so a message stays one line."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


EXIT_OK = 0
EXIT_FAILED = 1  # the cluster or a tool failed; the message says what was applied
EXIT_INVALID = 2  # bad input: spec, flags, config file; nothing was changed
EXIT_REFUSED = 3  # the plan holds changes queueplane refuses to make; nothing was changed
# plan --detailed-exitcode: there are changes to apply (terraform's 2 is taken by bad input here)
EXIT_CHANGES = 4
EXIT_STALE = 5  # apply FILE: the saved plan no longer matches its specs or the cluster; nothing was changed


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one spec file."""

    file: str
    pointer: str
    message: str
    hint: str | None = None
    line: int | None = None
    column: int | None = None

    def render(self) -> str:
        where = self.pointer or "/"
        text = f"{self.file}: {where}: {self.message}"
        if self.line is not None:
            text += f" (line {self.line}" + (f", column {self.column})" if self.column else ")")
        if self.hint:
            text += f". Hint: {self.hint}"
        return one_line(text)

    def as_dict(self) -> dict[str, object]:
        return {
            "file": self.file,
            "pointer": self.pointer,
            "message": self.message,
            "hint": self.hint,
            "line": self.line,
            "column": self.column,
        }


class QueueplaneError(Exception):
    """An error the CLI prints as one paragraph, with its exit code, never as a traceback."""

    exit_code = EXIT_FAILED


class SpecInvalid(QueueplaneError):
    """One or more specs are invalid; carries every problem found in the run."""

    exit_code = EXIT_INVALID

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(p.render() for p in problems))


class UsageError(QueueplaneError):
    """Bad flags, paths or config files."""

    exit_code = EXIT_INVALID


class ClusterUnreachable(QueueplaneError):
    """The Kafka cluster did not answer in time; nothing was changed."""


# Where a principal's missing ACL comes from, for messages about a refused request.
ACL_HINT = "a worker's ACLs come from spec.access.worker, granted by `queueplane apply`"


class ClusterRefused(QueueplaneError):
    """The Kafka cluster answered and refused: the credentials, or an ACL the request needs.

    Waiting does not help, so nothing retries it; the message names what was refused and
    never a secret.
    """


class PlanRefused(QueueplaneError):
    exit_code = EXIT_REFUSED


class PlanStale(QueueplaneError):
    """A saved plan no longer matches its specs or the cluster: applying it would not apply what
    was approved, so nothing is changed."""

    exit_code = EXIT_STALE


class DeployError(QueueplaneError):
    """A worker could not be submitted, started or stopped on its cluster."""


class LocalStackError(QueueplaneError):
    """The embedded local Kafka could not be fetched, started or stopped."""
