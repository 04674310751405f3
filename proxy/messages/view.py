"""An Anthropic Messages request as the shared conversation model (chat messages), and back.

Policies, sessions, the store, summaries and recall all work on chat
messages; this door reads its content blocks into that model and writes the
policy's decision back as content blocks:

- ``system`` (a string or text blocks) becomes one system message: pinned,
  never dropped; the client's own value is forwarded as it came. A system
  message inside ``messages`` (the API's mid-conversation system turns, which
  Claude Code sends every request) stays a system message in its place: pinned
  too, and written back as it came.
- A user message's ``tool_result`` blocks become ``tool`` messages (one per
  result, its ``tool_use_id`` as ``tool_call_id``), its other blocks one user
  message after them (Anthropic puts the results first). So a result goes
  into the window of the assistant message whose ``tool_use`` it answers, and
  trimming keeps them in one unit (policies/units.py), never split.
- An assistant message becomes one message with its text as content and its
  ``tool_use`` blocks as ``tool_calls``; ``thinking`` and
  ``redacted_thinking`` blocks stay in it (not counted: Anthropic drops
  earlier turns' thinking from the context), signatures untouched.
- Images and documents are priced by Anthropic's rules (proxy/messages/media.py);
  a text document is counted as its text.

Every message keeps the blocks it was read from under :data:`ORIGIN` (a
structured field: not counted, stored with the message), so writing back is
exact: a message the policy kept is its blocks as they came, ``cache_control``
markers where they were. Only a ``tool`` message whose content the policy
replaced (clipped or masked) is written anew, as a ``tool_result`` with that
content and its other fields as they were; the proxy's own messages (a
summary, a recall block) are text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from proxy.context.tokens import PRICED_PART
from proxy.errors import InvalidRequest
from proxy.messages.media import document_tokens, image_tokens

# The chat message's field holding the Anthropic blocks it was read from.
ORIGIN = "anthropic_blocks"
ROLES = frozenset({"user", "assistant", "system"})
# ORIGIN's key for a system message read from ``messages`` (the top-level one: "system").
SYSTEM_TURN = "system_turn"
THINKING = frozenset({"thinking", "redacted_thinking"})
# Content block types whose text a summary or recall may quote.
_TEXT = "text"


def _bad(param: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"{param}: {message}", param=param, code="invalid_value")


def check_max_tokens(body: Mapping[str, Any]) -> None:
    """``max_tokens``: required of a message request (not of count_tokens)."""
    value = body.get("max_tokens")
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidRequest("max_tokens: Field required (an integer >= 1).", param="max_tokens")


def check_request(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The body's fields this door reads, checked; its messages."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model: Field required (a non-empty string).", param="model")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise InvalidRequest("messages: Field required (an array).", param="messages")
    system = body.get("system")
    if system is not None and not isinstance(system, (str, list)):
        raise _bad("system", "must be a string or an array of text blocks.")
    if isinstance(system, list) and not all(isinstance(b, dict) for b in system):
        raise _bad("system", "every block must be an object.")
    for key in ("tools", "stop_sequences"):
        if body.get(key) is not None and not isinstance(body.get(key), list):
            raise _bad(key, "must be an array.")
    # Objects in Anthropic's API: anything else is the client's to fix here, not a
    # translator's crash downstream (litellm reads them as mappings).
    for key in ("thinking", "metadata", "tool_choice"):
        if body.get(key) is not None and not isinstance(body.get(key), dict):
            raise _bad(key, "must be an object.")
    if not all(isinstance(tool, dict) for tool in body.get("tools") or ()):
        raise _bad("tools", "every tool must be an object.")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise _bad("stream", "must be a boolean.")
    for i, message in enumerate(messages):
        at = f"messages.{i}"
        if not isinstance(message, dict):
            raise _bad(at, "must be an object.")
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise _bad(f"{at}.role", "must be 'user', 'assistant' or 'system'.")
        content = message.get("content")
        if role == "system" and isinstance(content, list):
            if not all(isinstance(b, dict) and b.get("type") == _TEXT for b in content):
                raise _bad(f"{at}.content", "a system message holds text blocks only.")
        elif isinstance(content, list):
            for j, block in enumerate(content):
                if not isinstance(block, dict) or not isinstance(block.get("type"), str):
                    raise _bad(f"{at}.content.{j}", "must be an object with a string 'type'.")
                if block["type"] == "tool_result" and not isinstance(block.get("tool_use_id"), str):
                    raise _bad(f"{at}.content.{j}.tool_use_id", "must be a string.")
                if block["type"] == "tool_use" and not (
                    isinstance(block.get("id"), str) and isinstance(block.get("name"), str)
                ):
                    raise _bad(f"{at}.content.{j}", "a tool_use block needs a string id and name.")
        elif not isinstance(content, str):
            raise _bad(f"{at}.content", "must be a string or an array of content blocks.")
    return messages


# -- Anthropic -> chat ---------------------------------------------------------


def chat_view(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The request's system and messages as chat messages (see the module docstring)."""
    out: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        out.append({"role": "system", "content": system_text(system), ORIGIN: {"system": system}})
    for message in body.get("messages") or ():
        out += message_view(message)
    return out


def system_text(system: object) -> str:
    if isinstance(system, str):
        return system
    if isinstance(system, list):
        return "\n".join(str(b.get("text", "")) for b in system if isinstance(b, Mapping))
    return ""


def message_view(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages: one, or a user's tool results and the rest."""
    role = message["role"]
    content = message["content"]
    if role == "system":
        return [{"role": role, "content": system_text(content), ORIGIN: {SYSTEM_TURN: content}}]
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if role == "assistant":
        return [assistant_view(content)]
    results = [b for b in content if b.get("type") == "tool_result"]
    rest = [b for b in content if b.get("type") != "tool_result"]
    out = [
        {
            "role": "tool",
            "tool_call_id": block["tool_use_id"],
            "content": result_content(block),
            ORIGIN: [block],
        }
        for block in results
    ]
    if rest or not results:
        out.append({"role": "user", "content": parts(rest), ORIGIN: rest})
    return out


def assistant_view(content: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """An assistant message's blocks as one chat message (tool_use blocks: its tool calls)."""
    calls = [
        {
            "id": block["id"],
            "type": "function",
            "function": {"name": block["name"], "arguments": _json(block.get("input", {}))},
        }
        for block in content
        if block.get("type") == "tool_use"
    ]
    shown = [b for b in content if b.get("type") not in THINKING and b.get("type") != "tool_use"]
    view: dict[str, Any] = {"role": "assistant", "content": parts(shown) or None}
    if calls:
        view["tool_calls"] = calls
    view[ORIGIN] = list(content)
    return view


def result_content(block: Mapping[str, Any]) -> str | list[dict[str, Any]]:
    """A tool_result's content as a chat tool message's: a string where it is text."""
    content = block.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(b, Mapping) and b.get("type") == _TEXT for b in content
    ):
        return "\n".join(str(b.get("text", "")) for b in content)
    return parts(content if isinstance(content, list) else [])


def parts(blocks: Sequence[Any]) -> list[dict[str, Any]]:
    """Content blocks as chat content parts: text as text, media as the parts the counter prices."""
    out: list[dict[str, Any]] = []
    for block in blocks:
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind == _TEXT:
            out.append({"type": "text", "text": str(block.get("text", ""))})
        elif kind == "image":
            out.append({"type": PRICED_PART, "tokens": image_tokens(block)})
        elif kind == "document":
            out.append(document_part(block))
        elif kind == "compaction":
            # Read as its summary (a failed one, without, as nothing); never its payload.
            if isinstance(block.get("content"), str):
                out.append({"type": "text", "text": block["content"]})
        elif kind not in THINKING:
            # Server tool blocks, search results...: counted as their JSON.
            out.append({"type": "text", "text": _json({k: v for k, v in block.items()})})
    return out


def document_part(block: Mapping[str, Any]) -> dict[str, Any]:
    """A document as a part: its text where it is text, else priced (a PDF's pages)."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, Mapping) else None
    if kind == "text" and isinstance(source, Mapping):
        return {"type": "text", "text": str(source.get("data", ""))}
    if kind == "content" and isinstance(source, Mapping):
        inner = source.get("content")
        text = inner if isinstance(inner, str) else system_text(inner)
        return {"type": "text", "text": text}
    return {"type": PRICED_PART, "tokens": document_tokens(block)}


def _json(value: object) -> str:
    return orjson.dumps(value).decode()


# -- chat -> Anthropic ---------------------------------------------------------


def anthropic_request(
    messages: Sequence[Mapping[str, Any]], system: object
) -> tuple[object, list[dict[str, Any]]]:
    """The policy's messages as Anthropic's ``system`` and ``messages``.

    ``system``: the client's own (forwarded as it came); a system message the
    proxy added (a summary) is appended to it as a text block.
    """
    added: list[str] = []
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role in ("system", "developer"):
            origin = message.get(ORIGIN)
            if isinstance(origin, Mapping) and SYSTEM_TURN in origin:
                _append(out, "system", origin[SYSTEM_TURN], merge=False)
            elif origin is None:
                added.append(str(message.get("content") or ""))
            continue
        if role == "tool":
            blocks: list[Any] = [tool_result(message)]
            _append(out, "user", blocks, merge=True)
            continue
        origin = message.get(ORIGIN)
        content = origin if isinstance(origin, list) else message.get("content")
        if role == "assistant" and isinstance(content, list):
            content = _with_inputs(content, message.get("tool_calls"))
        if isinstance(content, list) and not content:
            content = [{"type": "text", "text": ""}]
        # A user message read from one with tool results goes back into that message.
        _append(out, "assistant" if role == "assistant" else "user", content, merge=False)
    if added:
        system = _with_text(system, "\n\n".join(added))
    return system, out


def _with_inputs(blocks: list[Any], calls: object) -> list[Any]:
    """An assistant's blocks with each tool_use's input as its call now says (the proxy's
    clearing may have emptied one); the blocks as they came when none changed."""
    if not isinstance(calls, list):
        return blocks
    arguments = {
        c.get("id"): c["function"].get("arguments")
        for c in calls
        if isinstance(c, Mapping) and isinstance(c.get("function"), Mapping)
    }
    out = blocks
    for j, block in enumerate(blocks):
        if not isinstance(block, Mapping) or block.get("type") != "tool_use":
            continue
        now = arguments.get(block.get("id"))
        if isinstance(now, str) and now != _json(block.get("input", {})):
            if out is blocks:
                out = list(blocks)
            out[j] = {**block, "input": orjson.loads(now)}
    return out


def tool_result(message: Mapping[str, Any]) -> dict[str, Any]:
    """A tool message as its tool_result block: as it came, unless the policy replaced it."""
    origin = message.get(ORIGIN)
    block = origin[0] if isinstance(origin, list) and origin else None
    if isinstance(block, dict) and result_content(block) == message.get("content"):
        return block
    out: dict[str, Any] = dict(block) if isinstance(block, dict) else {"type": "tool_result"}
    out["tool_use_id"] = message.get("tool_call_id")
    content = message.get("content")
    out["content"] = content if isinstance(content, str) else _blocks(content)
    return out


def _blocks(content: object) -> list[dict[str, Any]]:
    if isinstance(content, list):
        return [
            {"type": "text", "text": str(p.get("text", ""))}
            for p in content
            if isinstance(p, Mapping) and p.get("type") == "text"
        ]
    return [{"type": "text", "text": str(content or "")}]


def _append(out: list[dict[str, Any]], role: str, content: Any, *, merge: bool) -> None:
    """Append a message; a tool result joins the user message of results before it, and a
    user message joins the results before it (they were one message)."""
    last = out[-1] if out else None
    if last is not None and last["role"] == "user" == role and _ends_with_result(last):
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        last["content"] = [*last["content"], *blocks]
        return
    if merge or isinstance(content, list):
        out.append({"role": role, "content": list(content)})
    else:
        out.append({"role": role, "content": content})


def _ends_with_result(message: Mapping[str, Any]) -> bool:
    content = message.get("content")
    return (
        isinstance(content, list)
        and bool(content)
        and isinstance(content[-1], Mapping)
        and content[-1].get("type") == "tool_result"
    )


def _with_text(system: object, text: str) -> object:
    if not system:
        return text
    if isinstance(system, str):
        return f"{system}\n\n{text}"
    if isinstance(system, list):
        return [*system, {"type": "text", "text": text}]
    return text


# -- the answer ----------------------------------------------------------------


def reply_view(message: Mapping[str, Any]) -> dict[str, Any] | None:
    """An Anthropic answer (a ``message`` object) as the chat reply the store keeps."""
    content = message.get("content")
    if message.get("role") != "assistant" or not isinstance(content, list):
        return None
    if not all(isinstance(b, dict) and isinstance(b.get("type"), str) for b in content):
        return None
    return assistant_view(content)


def chat_usage(usage: object) -> dict[str, Any] | None:
    """Anthropic's ``usage`` in the chat form the request row and calibration read.

    ``prompt_tokens`` is the whole prompt: what was read from and written to the
    cache counts too (Anthropic's ``input_tokens`` is only the rest).
    """
    if not isinstance(usage, Mapping):
        return None

    def number(key: str) -> int:
        value = usage.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    read = number("cache_read_input_tokens")
    written = number("cache_creation_input_tokens")
    out: dict[str, Any] = {
        "prompt_tokens": number("input_tokens") + read + written,
        "completion_tokens": number("output_tokens"),
    }
    if "cache_read_input_tokens" in usage:
        out["cache_read_input_tokens"] = read
        out["prompt_tokens_details"] = {"cached_tokens": read}
    if "cache_creation_input_tokens" in usage:
        out["cache_creation_input_tokens"] = written
    return out
