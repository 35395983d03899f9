"""Key names: one hash slot per task (so every script runs on Redis Cluster), and bad names refused."""

from __future__ import annotations

import copy
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.crc import key_slot

from runner.errors import ConfigError
from runner.keys import TaskKeys


def slots_of(keys: TaskKeys, slot_epoch_s: int = 1_700_000_040) -> set[int]:
    return {key_slot(k.encode()) for k in keys.all_keys(slot_epoch_s)}


@pytest.mark.parametrize(
    ("prefix", "scope", "task"),
    [
        ("cron-runner", "default", "report"),
        ("cron-runner", "cron-system", "invoice.monthly"),
        ("cr", "team-a.prod", "job-2024_v2"),
        ("app:locks:v1", "ns1", "0day"),
        ("x", "9", "a.b-c_d.0"),
        ("cron-runner", "a" * 63, "b" * 63),
    ],
)
def test_every_key_of_a_task_shares_the_hash_tag_slot(prefix: str, scope: str, task: str) -> None:
    keys = TaskKeys(prefix, scope, task)
    assert slots_of(keys) == {key_slot(f"{scope}:{task}".encode())}
    assert len(set(keys.all_keys())) == 7
    for key in keys.all_keys():
        assert key.count("{") == 1
        assert key.count("}") == 1


def test_slot_markers_of_many_slots_stay_in_the_task_slot() -> None:
    keys = TaskKeys("cron-runner", "default", "report")
    expected = key_slot(keys.lease.encode())
    assert {key_slot(keys.slot(s).encode()) for s in range(0, 86_400 * 3, 60)} == {expected}


def test_two_tasks_have_distinct_keys() -> None:
    a = TaskKeys("cron-runner", "ns", "a")
    b = TaskKeys("cron-runner", "ns", "b")
    other_scope = TaskKeys("cron-runner", "ns2", "a")
    assert not set(a.all_keys()) & set(b.all_keys())
    assert not set(a.all_keys()) & set(other_scope.all_keys())


def test_key_layout() -> None:
    keys = TaskKeys("cron-runner", "default", "report")
    assert keys.lease == "cron-runner:{default:report}:lease"
    assert keys.fence == "cron-runner:{default:report}:fence"
    assert keys.runs == "cron-runner:{default:report}:runs"
    assert keys.state == "cron-runner:{default:report}:state"
    assert keys.slot(1_700_000_040) == "cron-runner:{default:report}:slot:1700000040"


BAD_NAMES = [
    "",
    "a{b",
    "a}b",
    "{ab}",
    "a:b",
    "a" * 64,
    "-leading-dash",
    ".leading-dot",
    "_leading-underscore",
    "has space",
    "tab\there",
    "trailing-newline\n",
    "new\nline",
    "slash/name",
    "ünïcode",
    "a*b",
]


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_bad_task_names_are_config_errors(bad: str) -> None:
    with pytest.raises(ConfigError, match="task name"):
        TaskKeys("cron-runner", "default", bad)


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_bad_scopes_are_config_errors(bad: str) -> None:
    with pytest.raises(ConfigError, match="scope"):
        TaskKeys("cron-runner", bad, "report")


@pytest.mark.parametrize("bad", ["", "a{b", "a}b", "{x}", "p" * 64, ":x", "has space", "x\n"])
def test_bad_prefixes_are_config_errors(bad: str) -> None:
    with pytest.raises(ConfigError, match="prefix"):
        TaskKeys(bad, "default", "report")


def test_config_error_names_the_accepted_form() -> None:
    with pytest.raises(ConfigError) as info:
        TaskKeys("cron-runner", "default", "a:b")
    assert "'a:b'" in str(info.value)
    assert "1-63 characters" in str(info.value)


valid_name = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}", fullmatch=True)
junk = st.sampled_from([":", "{", "}", "\n", " ", "/", "é", "", "0"])
# Near misses find more bugs than random text: a valid name with junk before, inside or after.
near_miss = st.one_of(
    st.builds(lambda name, bad: name + bad, valid_name, junk),
    st.builds(lambda name, bad: bad + name, valid_name, junk),
    st.builds(lambda name, bad: name[:1] + bad + name[1:], valid_name, junk),
)
name_text = st.one_of(valid_name, near_miss, st.text(max_size=70))


@settings(max_examples=300)
@given(prefix=name_text | st.just("cron-runner"), scope=name_text, task=name_text)
def test_any_text_is_refused_or_gives_one_slot(prefix: str, scope: str, task: str) -> None:
    try:
        keys = TaskKeys(prefix, scope, task)
    except ConfigError:
        return
    assert slots_of(keys) == {key_slot(f"{scope}:{task}".encode())}
    for part in (scope, task):
        assert part
        assert len(part) <= 63
        assert not set(part) & set("{}:\n")
    assert not set(prefix) & set("{}\n")


def test_task_keys_are_values_compared_hashed_and_shown_by_their_fields() -> None:
    from runner.keys import SCRATCH_TASK_PREFIX, ScratchKeys  # noqa: PLC0415

    keys = TaskKeys("cron-runner", "default", "report")
    assert keys == TaskKeys(prefix="cron-runner", scope="default", task="report")
    assert keys != TaskKeys("cron-runner", "default", "invoice")
    assert len({keys, TaskKeys("cron-runner", "default", "report")}) == 1
    assert repr(keys) == "TaskKeys(prefix='cron-runner', scope='default', task='report')"
    with pytest.raises(AttributeError):
        keys.task = "other"
    assert copy.copy(keys) == keys == pickle.loads(pickle.dumps(keys))
    scratch = ScratchKeys("cron-runner", "default", SCRATCH_TASK_PREFIX + "1")
    assert scratch == ScratchKeys("cron-runner", "default", SCRATCH_TASK_PREFIX + "1")
    with pytest.raises(ValueError, match="scratch task"):
        ScratchKeys("cron-runner", "default", "report")
    with pytest.raises(ConfigError, match="scope"):
        ScratchKeys("cron-runner", "bad{scope}", SCRATCH_TASK_PREFIX + "1")
