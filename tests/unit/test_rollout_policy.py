"""The rollout policy alone, with synthetic outcomes: stage advance, abort at the threshold,
time-out, done, and every parameter refused by name. No broker, database or clock.

``walk`` drives a policy exactly as both engines do (``hub rollout`` and the server's
controller): send a stage, wait until the policy says the stage is over, count silent devices
as timed out, ask for the verdict.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgeagent.fleet.messages import Outcome
from edgeagent.hub.keys import HubError
from edgeagent.hub.policy import (
    FAILED,
    SUCCEEDED,
    TIMED_OUT,
    PolicyError,
    RolloutPolicy,
    StagedPolicy,
    Tally,
    Verdict,
    classify,
    stored_policy,
)

SILENT = "silent"  # a synthetic device that never answers


def walk(policy: RolloutPolicy, answers: list[str]) -> tuple[list[dict[str, int]], Verdict]:
    """Run ``policy`` over devices answering ``answers`` (succeeded, failed or silent).

    Returns each stage's cumulative status counts and the final verdict. Time is simulated: a
    stage starts at t=1000·k; answers arrive at once, silence lasts until the policy's deadline.
    """
    outcomes: dict[int, str] = {}
    stages: list[dict[str, int]] = []
    sizes = policy.stage_sizes(len(answers))
    done = 0
    for number, size in enumerate(sizes, 1):
        started = 1000.0 * number
        wave = range(done, size)
        done = size
        answered = {d: answers[d] for d in wave if answers[d] != SILENT}
        outcomes.update(answered)
        waiting = len(wave) - len(answered)
        assert policy.stage_over(waiting, started, started) == (waiting == 0)
        if waiting:
            just_before = math.nextafter(policy.deadline(started), 0)
            assert not policy.stage_over(waiting, started, just_before)
            assert policy.stage_over(waiting, started, policy.deadline(started))
            outcomes.update({d: TIMED_OUT for d in wave if d not in answered})
        counts = dict(Counter(outcomes.values()))
        stages.append(counts)
        verdict = policy.verdict(number, len(sizes), Tally.of(counts))
        if verdict.state != "next":
            return stages, verdict
    raise AssertionError("the last stage must end the rollout")


def test_a_healthy_rollout_advances_stage_by_stage_and_is_done_after_the_last() -> None:
    policy = StagedPolicy((25, 50, 100))
    stages, verdict = walk(policy, [SUCCEEDED] * 8)
    assert [sum(s.values()) for s in stages] == [2, 4, 8]
    assert verdict == Verdict("succeeded")


def test_failures_below_the_threshold_still_finish() -> None:
    # the last of 8 failed (12.5 %) against the default 20 %: done, with the failure counted
    stages, verdict = walk(StagedPolicy((50, 100)), [SUCCEEDED] * 7 + [FAILED])
    assert verdict.state == "succeeded" and stages[-1] == {FAILED: 1, SUCCEEDED: 7}


def test_the_rollout_aborts_at_the_threshold_not_below_it() -> None:
    policy = StagedPolicy((25, 50, 100), abort_threshold_pct=50)
    # stage 1: dev 0 failed, dev 1 succeeded → 1 of 2 = 50 % ≥ 50 %: aborted in stage 1
    stages, verdict = walk(policy, [FAILED, SUCCEEDED] + [SUCCEEDED] * 6)
    assert len(stages) == 1 and verdict.state == "aborted"
    assert verdict.reason == "stage 1: 1 of 2 devices failed (50 % ≥ abort threshold 50 %)"
    # one success more in stage 1 (1 of 3 = 33 %) and the rollout goes on to be done
    stages, verdict = walk(
        StagedPolicy((30, 100), abort_threshold_pct=50), [FAILED] + [SUCCEEDED] * 9
    )
    assert verdict.state == "succeeded"


def test_no_abort_before_min_executed_devices_finished() -> None:
    policy = StagedPolicy((10, 100), abort_threshold_pct=20, min_executed=3)
    assert policy.verdict(1, 2, Tally(finished=2, failed=2)) == Verdict("next")
    assert policy.verdict(1, 2, Tally(finished=3, failed=1)).state == "aborted"
    assert policy.verdict(2, 2, Tally(finished=3, failed=0)) == Verdict("succeeded")


def test_silent_devices_time_out_and_count_as_failed() -> None:
    policy = StagedPolicy((50, 100), abort_threshold_pct=50, stage_timeout_s=30)
    assert policy.deadline(1000.0) == 1030.0
    stages, verdict = walk(policy, [SILENT, SUCCEEDED, SUCCEEDED, SUCCEEDED])
    assert stages == [{TIMED_OUT: 1, SUCCEEDED: 1}] and verdict.state == "aborted"


def test_a_tally_counts_only_final_statuses() -> None:
    tally = Tally.of({SUCCEEDED: 3, FAILED: 1, TIMED_OUT: 1, "sent": 4, "queued": 9})
    assert (tally.finished, tally.failed, tally.failed_pct) == (5, 2, 40.0)
    assert Tally().failed_pct == 0.0


def test_what_a_device_answer_means() -> None:
    assert classify(Outcome("succeeded")) == SUCCEEDED
    assert classify(Outcome("refused", "same_version")) == SUCCEEDED
    assert classify(Outcome("refused", "replay")) == FAILED
    assert classify(Outcome("rolled_back", "golden_mismatch")) == FAILED
    assert classify(Outcome("failed")) == FAILED


def test_the_policy_round_trips_through_its_stored_fields() -> None:
    policy = StagedPolicy((10, 50, 100), abort_threshold_pct=5, min_executed=4, stage_timeout_s=9)
    row = {"id": "dep-1", "state": "running", **json.loads(json.dumps(policy.fields()))}
    assert stored_policy(row) == StagedPolicy.from_fields(row) == policy
    assert isinstance(policy, RolloutPolicy) and policy.name == "staged"
    with pytest.raises(TypeError):
        RolloutPolicy()  # type: ignore[abstract]


def test_a_missing_stage_timeout_is_capped_by_the_server_limit() -> None:
    assert StagedPolicy.from_fields({}).stage_timeout_s == 600
    assert StagedPolicy.from_fields({}, max_stage_timeout_s=60).stage_timeout_s == 60
    assert StagedPolicy.from_fields({"stage_timeout_s": 60}, max_stage_timeout_s=60)
    with pytest.raises(PolicyError, match=r"stage_timeout_s: must be in \(0, 60\]"):
        StagedPolicy.from_fields({"stage_timeout_s": 61}, max_stage_timeout_s=60)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"stages_pct": "5,25"}, "stages_pct"),
        ({"stages_pct": {"a": 1}}, "stages_pct"),
        ({"stages_pct": []}, "stages_pct"),
        ({"stages_pct": [50, 20, 100]}, "stages_pct"),
        ({"stages_pct": [50]}, "stages_pct"),
        ({"stages_pct": [10**400, 100]}, "stages_pct[0]"),
        ({"stages_pct": [10**5000, 100]}, "stages_pct[0]"),
        ({"stages_pct": [True, 100]}, "stages_pct[0]"),
        ({"stages_pct": [50, math.nan]}, "stages_pct[1]"),
        ({"stages_pct": [0, 100]}, "stages_pct[0]"),
        ({"stages_pct": ["5", 100]}, "stages_pct[0]"),
        ({"abort_threshold_pct": 0}, "abort_threshold_pct"),
        ({"abort_threshold_pct": 101}, "abort_threshold_pct"),
        ({"abort_threshold_pct": math.inf}, "abort_threshold_pct"),
        ({"abort_threshold_pct": "20"}, "abort_threshold_pct"),
        ({"abort_threshold_pct": None}, "abort_threshold_pct"),
        ({"min_executed": 0}, "min_executed"),
        ({"min_executed": 2.7}, "min_executed"),
        ({"min_executed": 2.0}, "min_executed"),
        ({"min_executed": True}, "min_executed"),
        ({"min_executed": 10**30}, "min_executed"),
        ({"min_executed": math.inf}, "min_executed"),
        ({"stage_timeout_s": 0}, "stage_timeout_s"),
        ({"stage_timeout_s": -1}, "stage_timeout_s"),
        ({"stage_timeout_s": math.inf}, "stage_timeout_s"),
        ({"stage_timeout_s": [30]}, "stage_timeout_s"),
    ],
)
def test_each_bad_parameter_is_refused_naming_its_field(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(PolicyError) as refused:
        StagedPolicy.from_fields(fields, max_stage_timeout_s=3600)
    assert refused.value.field == named
    assert str(refused.value).startswith(f"{named}: ")
    assert len(str(refused.value)) < 200  # a huge value is not echoed whole
    assert isinstance(refused.value, HubError)  # the CLI's usage error (exit 2)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)
KEYS = st.sampled_from(["stages_pct", "abort_threshold_pct", "min_executed", "stage_timeout_s"])


@given(st.dictionaries(KEYS, JSON))
def test_any_json_body_gives_a_policy_or_a_policy_error(fields: dict[str, Any]) -> None:
    try:
        policy = StagedPolicy.from_fields(fields, max_stage_timeout_s=3600)
    except PolicyError:
        return
    sizes = policy.stage_sizes(7)
    assert sizes[-1] == 7 and sizes == sorted(set(sizes)) and sizes[0] >= 1
