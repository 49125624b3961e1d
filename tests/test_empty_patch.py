"""The empty-patch guard: classifying exit-0, empty-patch rollouts from the trajectory, and the policy."""

import pytest

from agentrl.harness import EmptyPatchClass, EmptyPatchPolicy, Trajectory, classify_empty_patch, decide, get_harness

C = EmptyPatchClass


def traj(final_text, raw_ok=True) -> Trajectory:
    return Trajectory(final_text=final_text, turns=3, tool_calls=2, exit_reason="success", raw_ok=raw_ok)


@pytest.mark.parametrize("text, expected", [
    # The CLI took an announcement of the next step for the answer.
    ("Let me look at the failing test first.", C.MID_TASK_NARRATION),
    ("I'll now run the test suite to confirm.", C.MID_TASK_NARRATION),
    ("I will update utils.py next.", C.MID_TASK_NARRATION),
    ("Next, I need to check how count() is called.", C.MID_TASK_NARRATION),
    ("Now I can write the fix.", C.MID_TASK_NARRATION),
    ("I'm going to refactor the parser.", C.MID_TASK_NARRATION),
    ("Let's inspect the module.", C.MID_TASK_NARRATION),
    ("The bug is in count(). Let me check the file:", C.MID_TASK_NARRATION),
    ("I fixed the import. Now let me run the tests.", C.MID_TASK_NARRATION),   # the ending decides
    # The model says it is finished (and changed nothing).
    ("I've fixed the off-by-one in count().", C.CLAIMED_COMPLETION),
    ("The issue is resolved.", C.CLAIMED_COMPLETION),
    ("Done. The function now handles empty lists.", C.CLAIMED_COMPLETION),
    ("The change has been applied and all tests pass.", C.CLAIMED_COMPLETION),
    ("I have updated the parser; it should now work.", C.CLAIMED_COMPLETION),
    ("Fixed the bug. Let me know if you need anything else.", C.CLAIMED_COMPLETION),   # not narration
    ("Let me explain. The task is complete.\n\nThe test suite passes.", C.CLAIMED_COMPLETION),  # only the end
    # Neither.
    ("Could you clarify which version of the API you mean?", C.UNCLASSIFIED),
    ("The repository uses a custom build system.", C.UNCLASSIFIED),
    ("", C.NO_FINAL_TEXT),
    ("  \n\t ", C.NO_FINAL_TEXT),
    (None, C.NO_FINAL_TEXT),
])
def test_exit_zero_empty_patch_is_classified_by_the_final_text(text, expected):
    assert classify_empty_patch(0, True, traj(text)) is expected


@pytest.mark.parametrize("exit_code, patch_empty, raw_ok", [(1, True, True), (0, False, True), (0, True, False),
                                                             (137, True, False), (2, False, False)])
def test_it_is_not_triggered_by_failures_real_patches_or_unreadable_output(exit_code, patch_empty, raw_ok):
    assert classify_empty_patch(exit_code, patch_empty, traj("Let me look.", raw_ok)) is C.NOT_TRIGGERED


@pytest.mark.parametrize("stdout", [b"", b"\x00\xff garbage", b'{"type": "result", "result": 5}',
                                    b'{"type": "result", "subtype": "success", "num_turns": "2", "result": "x"}',
                                    b'{"type": "assistant", "message": {"content": [{"type": "text", "text": "Hi"}]}}',
                                    b'{"final_text": "Let me", "turns": 1}'])
def test_a_malformed_trajectory_degrades_to_not_triggered(stdout):
    for name in ("claude_code", "qwen_code", "codebuddy", "builtin"):
        assert classify_empty_patch(0, True, get_harness(name).read_trajectory(stdout, b"")) is C.NOT_TRIGGERED


POLICY_TABLE = {
    # policy: the decision for each class, in EmptyPatchClass order
    "off": dict.fromkeys(C, "train"),
    "metrics": dict.fromkeys(C, "train"),
    "abort": {C.NOT_TRIGGERED: "train", C.MID_TASK_NARRATION: "retry", C.CLAIMED_COMPLETION: "train",
              C.NO_FINAL_TEXT: "retry", C.UNCLASSIFIED: "train"},
}


@pytest.mark.parametrize("policy", sorted(POLICY_TABLE))
@pytest.mark.parametrize("cls", list(C))
def test_policy_decides_train_or_retry(policy, cls):
    assert decide(policy, cls) == POLICY_TABLE[policy][cls]
    assert decide(EmptyPatchPolicy(policy), cls.value) == POLICY_TABLE[policy][cls]


def test_an_unknown_policy_or_class_is_refused():
    with pytest.raises(ValueError):
        decide("sometimes", C.UNCLASSIFIED)
    with pytest.raises(ValueError):
        decide("abort", "lazy")
