"""policies/facts.py: pinned facts found deterministically, bounded, and checked against a source."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.facts import Fact, extract, facts_from_json, merge, render, unsupported


@pytest.mark.parametrize(
    ("text", "fact"),
    [
        ("My order #1234 is late", Fact("id", "order #1234")),
        ("Ticket ABC-123 was reopened", Fact("id", "Ticket ABC-123")),
        ("booking ref: ZX81Q", Fact("id", "ref: ZX81Q")),
        ("see #44120 for details", Fact("id", "#44120")),
        ("reservation 8JX2K9 changed", Fact("id", "reservation 8JX2K9")),
        ("the user id is mia_li_3668", Fact("id", "mia_li_3668")),
        ("flight HAT170 departs", Fact("id", "flight HAT170")),
        ("it failed with E1234", Fact("error", "E1234")),
        ("got HTTP 502 twice", Fact("error", "HTTP 502")),
        ("connect ECONNREFUSED", Fact("error", "ECONNREFUSED")),
        ("segfault at 0x7ffe12ab", Fact("error", "0x7ffe12ab")),
        ("upgraded to v2.3.1", Fact("version", "v2.3.1")),
        ("running 1.4.0-rc1 now", Fact("version", "1.4.0-rc1")),
        ("it cost $120.50", Fact("amount", "$120.50")),
        ("refund of 30 EUR", Fact("amount", "30 EUR")),
        ("due 2024-03-05", Fact("date", "2024-03-05")),
        ("on 7 May 2023", Fact("date", "7 May 2023")),
        ("since March 3rd, 2021", Fact("date", "March 3rd, 2021")),
        ("paid 03/05/2024", Fact("date", "03/05/2024")),
        ("mail jo.doe@example.com today", Fact("email", "jo.doe@example.com")),
        (
            "docs at https://x.example.com/a/1234?q=1.",
            Fact("url", "https://x.example.com/a/1234?q=1"),
        ),
        ("call 5551234567", Fact("number", "5551234567")),
    ],
)
def test_each_kind_is_found_verbatim(text, fact):
    assert fact in extract([text])


def test_the_digits_of_a_url_or_an_email_are_not_found_again():
    facts = extract(["https://shop.example.com/orders/98765 and a1234@example.com"])
    assert [f.kind for f in facts] == ["url", "email"]


def test_plain_words_and_small_numbers_are_no_facts():
    assert extract(["I have 3 kids and we met at 4pm on the big day, it was great."]) == []


def test_facts_are_deduplicated_in_order_of_first_appearance():
    facts = extract(["order #1 no, order #1234", "E500 then order #1234 again", "E500"])
    assert [f.value for f in facts] == ["order #1234", "E500"]


def test_merge_bounds_by_count_keeping_ids_first_then_the_newest():
    old = [Fact("date", "2024-01-01"), Fact("id", "order #1"), Fact("id", "order #2")]
    new = [Fact("id", "order #3"), Fact("date", "2024-02-02"), Fact("id", "order #1")]
    kept = merge(old, new, max_facts=3)
    # All three ids beat the dates; the survivors keep their first-seen order.
    assert [f.value for f in kept] == ["order #1", "order #2", "order #3"]
    kept = merge(old, new, max_facts=2)
    # order #1 was mentioned again last, so it outranks order #2.
    assert [f.value for f in kept] == ["order #1", "order #3"]


def test_merge_bounds_by_rendered_tokens():
    facts = [Fact("id", f"order #{n:05d}") for n in range(20)]
    kept = merge(facts, [], max_tokens=30, count_text=lambda line: len(line) // 4)
    assert sum(len(f"- id: {f.value}") // 4 for f in kept) <= 30
    assert 0 < len(kept) < 20


def test_render_lists_each_fact_on_a_line():
    assert render([]) == ""
    text = render([Fact("id", "order #1"), Fact("email", "a@b.co")])
    assert text.splitlines()[1:] == ["- id: order #1", "- email: a@b.co"]


def test_unsupported_flags_what_the_source_never_says():
    source = "User: my order #1234 cost $1,250.00 and failed with E500 on 2024-03-05."
    summary = "Order 1234 (1250.00 USD) failed with E500 on 2024-03-05; refund 77 for order #1235."
    assert unsupported(summary, source) == ["order #1235", "77"]


def test_unsupported_finds_nothing_in_a_faithful_summary():
    source = "Caroline went to the support group on 7 May 2023 with jo@x.io."
    assert unsupported("Caroline attended on 7 May 2023 (contact jo@x.io).", source) == []


def test_stored_facts_are_read_back_and_malformed_entries_skipped():
    data = [{"kind": "id", "value": "order #1"}, {"kind": 3}, "x", {"value": "v"}]
    assert facts_from_json(data) == (Fact("id", "order #1"),)
    assert facts_from_json(None) == ()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet="ab #-_@.:/$0123456789ABXEorder ", max_size=60), max_size=5))
def test_every_fact_is_text_that_was_there(texts):
    joined = "\n".join(texts)
    for fact in extract(texts):
        assert " ".join(fact.value.split()) in " ".join(joined.split())
        assert unsupported(fact.value, joined) == []
