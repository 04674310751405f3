"""Every endpoint the generated-body fuzz covers, as one table (tests/reliability/test_fuzz.py).

An endpoint added to the proxy gets a row here: its method and path, the
strategy its generated bodies come from (None: a request without one), the
strategy of the id put in its path. ``share`` scales the run's bodies per
endpoint for endpoints with less to parse (a path id, no body).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from hypothesis import strategies as st

from tests.reliability import bodies

# Path ids: what a client may put where a response id goes (quoted into the path; never
# empty, which would make the path another endpoint's, relayed unchanged).
_odd_ids = st.sampled_from(["resp_nope", "..", "a/b", "%00", "ユ", " "])
ids = bodies.texts.filter(bool) | _odd_ids | st.just("resp_1")
# Never the seeded response (resp_1): the fuzz checks what was stored before stays.
deletable_ids = bodies.texts.filter(lambda i: i not in ("", "resp_1")) | _odd_ids


@dataclass(frozen=True)
class Endpoint:
    name: str
    method: str
    # "{id}" is replaced by a generated id, percent-encoded.
    path: str
    bodies: Any = None
    ids: Any = None
    share: float = 1.0
    # The door whose error shape its own 4xx must have ("openai" or "anthropic").
    door: str = "openai"

    def url(self, base: str, id_: str | None) -> str:
        return base + self.path.replace("{id}", quote(id_ or "", safe=""))


ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint(
        "chat completions",
        "POST",
        "/v1/chat/completions",
        bodies.chat_bodies | bodies.raw_garbage,
    ),
    Endpoint(
        "responses",
        "POST",
        "/v1/responses",
        bodies.responses_bodies | bodies.raw_garbage,
    ),
    Endpoint(
        # A compaction calls its summarizer (the chat fake); valid bodies store summaries.
        "responses compact",
        "POST",
        "/v1/responses/compact",
        bodies.responses_bodies | bodies.raw_garbage,
    ),
    Endpoint(
        # Translated to the OpenAI-compatible fake (the default upstream is not Anthropic's).
        "anthropic messages",
        "POST",
        "/v1/messages",
        bodies.messages_bodies | bodies.raw_garbage,
        share=0.5,
        door="anthropic",
    ),
    Endpoint(
        "anthropic count tokens",
        "POST",
        "/v1/messages/count_tokens",
        bodies.messages_bodies | bodies.raw_garbage,
        share=0.2,
        door="anthropic",
    ),
    Endpoint(
        "context preview",
        "POST",
        "/v1/context/preview",
        bodies.chat_bodies | bodies.responses_bodies | bodies.raw_garbage,
        share=0.5,
    ),
    Endpoint(
        "response retrieve",
        "GET",
        "/v1/responses/{id}",
        ids=ids,
        share=0.1,
    ),
    Endpoint(
        "response input items",
        "GET",
        "/v1/responses/{id}/input_items",
        ids=ids,
        share=0.1,
    ),
    Endpoint(
        "response delete",
        "DELETE",
        "/v1/responses/{id}",
        ids=deletable_ids,
        share=0.1,
    ),
    Endpoint(
        "relayed unchanged (every other /v1 path)",
        "POST",
        "/v1/embeddings",
        st.fixed_dictionaries({"model": bodies.models, "input": bodies.mostly(bodies.texts)})
        | bodies.json_values
        | bodies.raw_garbage,
        share=0.2,
    ),
)
