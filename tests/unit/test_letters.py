"""What becomes of a retried dead letter (``table.letters.classify``): pure, no catalog."""

from __future__ import annotations

from tidewater.table.letters import OPEN, LetterState, classify, refusals


def test_a_refusal_names_its_topic_and_falls_on_that_topics_letter_only():
    """Two topics' letters at partition 0 offset 2: the change table refused topic a's; topic b's is resolved."""
    claimed = [("a", 0, 2), ("b", 0, 2)]
    refused = refusals([["a", 0, 2, "a later change of the key is applied"]], "rpc.ca")
    got = classify(claimed, {}, refused, set())
    assert got == [(LetterState.REFUSED, "refused by rpc.ca: a later change of the key is applied"), (LetterState.RESOLVED, None)]


def test_a_refusal_stamped_before_topics_were_stamped_stands_for_every_topic():
    """A retry committed by an earlier version (refused_letters as [partition, offset, why]) and finished by this one."""
    refused = refusals([[0, 2, "why"]], "rpc.ca")
    assert [s for s, _ in classify([("a", 0, 2), ("b", 0, 2), ("b", 0, 3)], {}, refused, set())] == [
        LetterState.REFUSED,
        LetterState.REFUSED,
        LetterState.RESOLVED,
    ]


def test_failed_again_comes_first_then_refused_then_skipped_then_resolved():
    c = [("t", 0, o) for o in range(5)]
    again = {("t", 0, 0): "Bad: still bad", ("t", 0, 1): "Bad: again"}
    refused = refusals([["t", 0, 1, "x"], ["t", 0, 2, "y"]], "rpc.c")
    got = classify(c, again, refused, {("t", 0, 2), ("t", 0, 3)})
    assert [s for s, _ in got] == [
        LetterState.FAILED_AGAIN,
        LetterState.FAILED_AGAIN,
        LetterState.REFUSED,
        LetterState.SKIPPED,
        LetterState.RESOLVED,
    ]
    assert got[0][1] == "Bad: still bad" and got[4][1] is None


def test_the_states_after_which_a_letter_is_open_again():
    assert set(OPEN) == {"released", "refused", "failed-again"}
    assert {s.value for s in LetterState} - set(OPEN) == {"retrying", "resolved", "skipped", "dropped"}
