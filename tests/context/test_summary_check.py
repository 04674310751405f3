"""proxy/context/summary_check.py: a summary is refused when cut off or an echo of its input."""

from __future__ import annotations

from proxy.context.summary_check import check_summary, copied_share

TRANSCRIPT = """[user]
Hi, my order #88231 has not arrived and the tracking page has said in transit for nine days now.

[assistant called tool track]
{"order": "88231"}

[tool result call_1]
status: in transit, last scan Leipzig hub on 2024-03-02, carrier DHL

[assistant]
I checked: the parcel was last scanned at the Leipzig hub on 2 March. I have opened ticket T-5512.

[user]
Thanks. Can you send a replacement if it is not here by Friday?"""

SUMMARY = """## Goal and context
- Customer wants order #88231, undelivered after nine days.
## Steps tried and results
- Tracking: last scan Leipzig hub, 2024-03-02 (DHL). Ticket T-5512 opened.
## Next step
- Replacement if still missing by Friday (UNVERIFIED: not yet agreed)."""


def test_a_real_summary_passes():
    assert check_summary(SUMMARY, TRANSCRIPT, "stop").reason is None
    assert copied_share(SUMMARY, TRANSCRIPT) < 0.2


def test_a_summary_cut_off_at_max_tokens_is_refused():
    verdict = check_summary(SUMMARY, TRANSCRIPT, "length")
    assert verdict.reason == "cut_off"


def test_an_answer_that_repeats_the_transcript_is_refused():
    echo = TRANSCRIPT.replace("[user]", "User:").replace("[assistant]", "Assistant:")
    assert check_summary(echo, TRANSCRIPT, "stop").reason == "echo"


def test_an_answer_that_opens_with_the_conversation_is_refused():
    opening = "Hi, my order #88231 has not arrived and the tracking page has said in transit"
    verdict = check_summary(opening + "\n- Summary: the order is late.", TRANSCRIPT, None)
    assert verdict.reason == "echo"
    assert "opens" in verdict.detail


def test_an_answer_made_of_copied_runs_is_refused_with_its_share():
    copied = (
        "the tracking page has said in transit for nine days now. "
        "the parcel was last scanned at the Leipzig hub on 2 March. I have opened ticket T-5512."
    )
    verdict = check_summary(copied, TRANSCRIPT, "stop")
    assert verdict.reason == "echo"
    assert "copied" in verdict.detail


def test_a_short_answer_is_never_called_an_echo():
    assert check_summary("Order 88231 late; ticket T-5512.", TRANSCRIPT, "stop").reason is None
