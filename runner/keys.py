"""Redis key names of one task. Every key shares the hash tag ``{scope:task}`` (docs/design.md)."""

from __future__ import annotations

import re

from runner.errors import ConfigError

# Braces would break the hash tag and colons the key layout; anything a DNS label or a
# Python identifier allows is accepted. \Z, not $: $ also matches before a trailing newline.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\Z")
PREFIX_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}\Z")
NAME_FORM = "1-63 characters of letters, digits, '.', '_' or '-', starting with a letter or digit"


def validate_name(what: str, value: str) -> str:
    if not NAME_RE.match(value):
        raise ConfigError(f"{what} {value!r} is not valid: expected {NAME_FORM}")
    return value


def scope_index(prefix: str, scope: str) -> str:
    return f"{prefix}:{{{scope}:}}:tasks"


class TaskKeys:
    """Immutable, compared and hashed by value. A plain class, not a frozen dataclass: every
    run builds one, and a dataclass costs ~1 ms of start-up to create (bench/README.md)."""

    __slots__ = ("base", "prefix", "scope", "task")
    prefix: str
    scope: str
    task: str
    # Every key's stem, built once: a run's lease asks for key names at every call.
    base: str

    def __init__(self, prefix: str, scope: str, task: str) -> None:
        setter = object.__setattr__
        setter(self, "prefix", prefix)
        setter(self, "scope", scope)
        setter(self, "task", task)
        self._validate()
        setter(self, "base", f"{prefix}:{{{scope}:{task}}}")

    def _validate(self) -> None:
        if not PREFIX_RE.match(self.prefix):
            raise ConfigError(
                f"key prefix {self.prefix!r} is not valid: expected letters, digits, '.', '_', "
                "'-' or ':' (no braces), at most 63 characters"
            )
        validate_name("scope", self.scope)
        validate_name("task name", self.task)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r}: {type(self).__name__} is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r}: {type(self).__name__} is immutable")

    def _key(self) -> tuple[str, str, str]:
        return (self.prefix, self.scope, self.task)

    def __reduce__(self) -> tuple[type[TaskKeys], tuple[str, str, str]]:
        # copy and pickle rebuild it through __init__, as they did the frozen dataclass.
        return (type(self), self._key())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TaskKeys) or other.__class__ is not self.__class__:
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (
            f"{type(self).__qualname__}(prefix={self.prefix!r}, scope={self.scope!r}, "
            f"task={self.task!r})"
        )

    @property
    def index(self) -> str:
        """The scope's set of task names, for status and the watchdog under an ACL without
        SCAN. Its hash tag is the scope and a colon, so the per-scope ACL pattern
        ``~PREFIX:{SCOPE:*`` covers it like the tasks' keys (docs/reliability.md)."""
        return scope_index(self.prefix, self.scope)

    @property
    def lease(self) -> str:
        return f"{self.base}:lease"

    def slot_lease(self, slot_epoch_s: int) -> str:
        """Overlap allow-other-slots: one lease per slot, so that slots run side by side."""
        return f"{self.lease}:{slot_epoch_s}"

    @property
    def buffer(self) -> str:
        """Overlap buffer-one: the newest slot that waited for the lease or took it."""
        return f"{self.base}:buffer"

    @property
    def preempt(self) -> str:
        """Overlap replace: "SLOT TOKEN" of the run of a newer slot asking the holder to stop."""
        return f"{self.base}:preempt"

    @property
    def fence(self) -> str:
        return f"{self.base}:fence"

    @property
    def meta(self) -> str:
        """The protocol version and the task's definition (runner.lease.scripts, ACQUIRE)."""
        return f"{self.base}:meta"

    @property
    def runs(self) -> str:
        return f"{self.base}:runs"

    @property
    def state(self) -> str:
        return f"{self.base}:state"

    @property
    def missed(self) -> str:
        """The missed-slot ledger: a sorted set of fire times that passed with no run."""
        return f"{self.base}:missed"

    def slot(self, slot_epoch_s: int) -> str:
        return f"{self.base}:slot:{slot_epoch_s}"

    def all_keys(self, slot_epoch_s: int = 0) -> list[str]:
        return [
            self.lease,
            self.fence,
            self.meta,
            self.runs,
            self.state,
            self.missed,
            self.slot(slot_epoch_s),
        ]


#: `cron-runner check` runs the lease scripts on a task named like this: the leading '_' is
#: outside NAME_RE, so no real task can have it, and status and the watchdog skip it.
SCRATCH_TASK_PREFIX = "_cron-runner-check-"


class ScratchKeys(TaskKeys):
    """The keys of `check`'s scratch task, in the scope's keyspace like any task's."""

    __slots__ = ()

    def _validate(self) -> None:
        TaskKeys(self.prefix, self.scope, "check")  # validates prefix and scope
        if not self.task.startswith(SCRATCH_TASK_PREFIX):
            raise ValueError(f"a scratch task name starts with {SCRATCH_TASK_PREFIX!r}")
