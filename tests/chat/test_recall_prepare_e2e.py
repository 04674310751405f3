"""After a request with recall, the chat pipeline counts the left-out messages' recall lines
ahead (RecallService.prepare), so the block that first quotes them tokenizes nothing."""

from __future__ import annotations

import uuid
from typing import Any

from policies.recall import line_message
from proxy.context.tokens import counter_for
from tests.chat.test_recall_e2e import POLICY, QUESTION, ROUTE
from tests.chat.test_trim_e2e import client
from tests.context.test_recall_prepare import Spy


def test_the_left_out_messages_lines_are_counted_after_a_request_with_recall(
    fake, start_proxy, monkeypatch
):
    upstream, _ = fake
    proxy = start_proxy(policies=POLICY, routes=ROUTE)
    # Texts no other test has counted (the process's count caches are shared).
    tag = uuid.uuid4().hex
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are a shop assistant."}]
    for t in range(1, 41):
        history.append({"role": "user", "content": f"Turn {t} {tag}: tell me about topic {t}."})
        history.append({"role": "assistant", "content": f"Topic {t} {tag} is a fine topic."})
    history.append({"role": "user", "content": QUESTION})
    raw = client(proxy, "prepare").chat.completions.with_raw_response.create(
        model="gpt-4o", messages=history
    )
    assert raw.headers["x-context-recall"] in ("recalled", "none")
    proxy.drain()  # the counting runs in the background, after the answer
    forwarded = {m["content"] for m in upstream.received[-1].json["messages"]}
    left_out = [i for i, m in enumerate(history) if m["content"] not in forwarded]
    assert len(left_out) > 40
    lines = [line_message(history, i) for i in left_out]
    counter = counter_for("gpt-4o")
    spy = Spy()
    monkeypatch.setattr(counter, "_encoding", spy)
    counts = [counter.count_message(line) for line in lines if line is not None]
    assert len(counts) == len(left_out) and all(n > 0 for n in counts)
    assert spy.texts == []  # every line was in the cache: nothing tokenized
    # A line of a message never sent is not there (the spy sees a miss).
    unsent = [*history[:-1], {"role": "user", "content": f"never sent {tag}"}]
    new_line = line_message(unsent, len(unsent) - 1)
    assert new_line is not None
    counter.count_message(new_line)
    assert spy.texts
