"""The shape of a request body, checked once at parse time: bounded depth, typed fields.

Everything past this point (routing, sessions, hashing, token counts, the
policies, the store) may then rely on the types it reads: a role is a known
string, ``tool_calls`` is a list of objects whose ``id`` is a string, and no
value is nested deeper than a serializer can write back. A body outside that
shape gets one 400 in OpenAI's form naming the field, never a 500 from deep
inside the pipeline. Fields the proxy does not read are left to the upstream
(it is the judge of its own API); only the ones the proxy reads are checked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import repeat
from typing import Any

from proxy.errors import InvalidRequest
from proxy.store.base import StoredItem

# Nesting allowed in a body. orjson reads 1,024 levels but writes only 254;
# the proxy wraps stored values a few levels deeper (exports, request rows),
# so the bound leaves ample room. OpenAI's own bodies need well under 20.
MAX_DEPTH = 128
# The longest excerpt of a client's value echoed into an error (and so the log).
MAX_ECHO = 200

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def shown(value: object, limit: int = MAX_ECHO) -> str:
    """``repr(value)`` cut to ``limit`` characters: what an error may quote of a client's value."""
    if isinstance(value, str) and len(value) > limit:
        return repr(value[:limit]) + f"… ({len(value)} characters)"
    if isinstance(value, (list, dict)) and len(value) > limit:
        return f"<{type(value).__name__} of {len(value)} elements>"
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"… ({len(text)} characters)"


def check_depth(data: object, brackets: int, *, deferred: str | None = None) -> None:
    """Refuse ``data`` nested deeper than MAX_DEPTH.

    ``brackets``: how many ``[`` and ``{`` the raw body holds (counted in C);
    with no more than MAX_DEPTH of them the body cannot be too deep, so the
    usual body is not walked at all. ``deferred``: a top-level key whose
    elements the caller checks itself, one by one (:func:`check_element_depth`):
    the chat pipeline checks only the messages its cache does not hold.
    """
    if brackets <= MAX_DEPTH:
        return
    if deferred is not None and isinstance(data, dict):
        # The deferred list sits at depth 2, its elements at 3: checked by the caller.
        for key, value in data.items():
            if key != deferred and isinstance(value, (dict, list)):
                _walk(value, 2)
        return
    _walk(data, 1)


def check_element_depth(element: object) -> None:
    """An element of the body's deferred list (see :func:`check_depth`): at depth 3."""
    if isinstance(element, (dict, list)):
        _walk(element, 3)


def _walk(data: object, start: int) -> None:
    stack: list[tuple[object, int]] = [(data, start)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise InvalidRequest(
                f"The request body is nested more than {MAX_DEPTH} levels deep.",
                code="invalid_json",
            )
        children = value.values() if isinstance(value, dict) else value
        for child in children:  # type: ignore[attr-defined]
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))


def _bad(param: str, message: str, code: str = "invalid_type") -> InvalidRequest:
    return InvalidRequest(f"{param} {message}", param=param, code=code)


def _optional(
    body: Mapping[str, Any], key: str, kind: type | tuple[type, ...], what: str, prefix: str = ""
) -> None:
    value = body.get(key)
    if value is not None and not isinstance(value, kind):
        raise _bad(f"{prefix}{key}", f"must be {what}; got {shown(value)}.")


def _objects(body: Mapping[str, Any], key: str, prefix: str = "") -> None:
    """``body[key]``, when present, is a list of objects."""
    value = body.get(key)
    if value is None:
        return
    if not isinstance(value, list):
        raise _bad(f"{prefix}{key}", f"must be an array; got {shown(value)}.")
    for i, element in enumerate(value):
        if not isinstance(element, dict):
            raise _bad(f"{prefix}{key}[{i}]", f"must be an object; got {shown(element)}.")


def check_model(body: Mapping[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest(
            f"'model' is required and must be a non-empty string; got {shown(model)}.",
            param="model",
        )
    return model


def _common(body: Mapping[str, Any]) -> None:
    """Top-level fields both endpoints share and the proxy reads."""
    check_model(body)
    _objects(body, "tools")
    _optional(body, "metadata", dict, "an object")
    _optional(body, "user", str, "a string")
    _optional(body, "stream_options", dict, "an object")
    _optional(body, "tool_choice", (str, dict), "a string or an object")


def check_chat(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A chat completions body's shape; returns its messages."""
    messages = check_chat_envelope(body)
    for i, message in enumerate(messages):
        _message(message, i)
    return messages


def check_chat_message(message: dict[str, Any], index: int) -> None:
    """One message of ``messages`` (at ``index``): what :func:`check_chat` checks of each,
    and its depth when the body was parsed with ``deferred="messages"``."""
    if _plain(message):
        return  # nothing nested: no depth to walk
    check_element_depth(message)
    _message(message, index)


def check_chat_envelope(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A chat completions body's shape but each message's own fields; returns its messages.

    The pipeline checks each message with :func:`check_chat_message`, except
    those its message cache holds (the same JSON as a message checked before).
    """
    _common(body)
    _objects(body, "functions")
    _optional(body, "function_call", (str, dict), "a string or an object")
    messages = body.get("messages")
    if messages is None:
        raise InvalidRequest(
            "'messages' is required.", param="messages", code="missing_required_parameter"
        )
    if not isinstance(messages, list):
        raise _bad("messages", f"must be an array; got {shown(messages)}.")
    if not all(map(isinstance, messages, repeat(dict))):  # in C: a request is read in full
        for i, message in enumerate(messages):
            if not isinstance(message, dict):
                raise _bad(f"messages[{i}]", f"must be an object; got {shown(message)}.")
    return messages


# A message with only these keys, a known role and text content (most of them)
# needs no further look: no per-field paths are built for it.
_PLAIN_KEYS = frozenset({"role", "content", "name"})


def _plain(message: dict[str, Any]) -> bool:
    """A message with only ``_PLAIN_KEYS``, a known role and text: valid, and one level deep."""
    if message.keys() <= _PLAIN_KEYS:
        role, content, name = message.get("role"), message.get("content"), message.get("name")
        return (
            type(role) is str
            and role in ROLES
            and (content is None or type(content) is str)
            and (name is None or type(name) is str)
        )
    return False


def _message(message: dict[str, Any], where: str | int) -> None:
    """``where``: the message's name in errors (an int: its index in ``messages``)."""
    if _plain(message):
        return
    at = f"messages[{where}]" if isinstance(where, int) else where
    role = message.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise InvalidRequest(
            f"{at}.role must be one of {', '.join(sorted(ROLES))}; got {shown(role)}.",
            param=f"{at}.role",
            code="invalid_value",
        )
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        if not isinstance(content, list):
            raise _bad(f"{at}.content", f"must be a string or an array; got {shown(content)}.")
        _objects(message, "content", f"{at}.")
    for key in ("name", "tool_call_id", "refusal"):
        _optional(message, key, str, "a string", f"{at}.")
    _optional(message, "function_call", dict, "an object", f"{at}.")
    call = message.get("function_call")
    if isinstance(call, dict):
        _function(call, f"{at}.function_call")
    calls = message.get("tool_calls")
    if calls is None:
        return
    _objects(message, "tool_calls", f"{at}.")
    for n, tool_call in enumerate(calls):
        where = f"{at}.tool_calls[{n}]"
        if not isinstance(tool_call.get("id"), str):
            raise _bad(f"{where}.id", f"must be a string; got {shown(tool_call.get('id'))}.")
        _optional(tool_call, "type", str, "a string", f"{where}.")
        function = tool_call.get("function")
        if function is not None:
            if not isinstance(function, dict):
                raise _bad(f"{where}.function", f"must be an object; got {shown(function)}.")
            _function(function, f"{where}.function")


def _function(function: dict[str, Any], at: str) -> None:
    _optional(function, "name", str, "a string", f"{at}.")
    _optional(function, "arguments", str, "a string", f"{at}.")


def check_responses(body: Mapping[str, Any]) -> None:
    """A Responses body's shape (``input`` items are objects with typed keys)."""
    _common(body)
    _optional(body, "previous_response_id", str, "a string")
    _optional(body, "instructions", (str, list), "a string or an array")
    value = body.get("input")
    if value is None or isinstance(value, str):
        return
    if not isinstance(value, list):
        raise _bad("input", f"must be a string or an array of items; got {shown(value)}.")
    for i, item in enumerate(value):
        at = f"input[{i}]"
        if not isinstance(item, dict):
            raise _bad(at, f"must be an object; got {shown(item)}.")
        for key in ("type", "role", "id", "call_id", "name", "arguments"):
            _optional(item, key, str, "a string", f"{at}.")
        role = item.get("role")
        if role is not None and role not in ROLES:
            raise InvalidRequest(
                f"{at}.role must be one of {', '.join(sorted(ROLES))}; got {shown(role)}.",
                param=f"{at}.role",
                code="invalid_value",
            )
        content = item.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise _bad(f"{at}.content", f"must be a string or an array; got {shown(content)}.")
        if isinstance(content, list):
            _objects(item, "content", f"{at}.")


def check_chat_history(history: Sequence[StoredItem], session: str, *, start: int = 0) -> list[int]:
    """A stored history a chat request can replay; the positions to leave out of it.

    ``start``: the items before it are known to pass (checked by an earlier call).

    A session the Responses API wrote holds items (function calls, outputs,
    output messages with typed parts) that chat completions cannot take as
    messages. Rather than translate them by guesswork, such a session is
    refused with a 400 that names the conflict; its items stay as stored.

    A reply that is not a whole answer (a cut or stalled stream, one without
    ``[DONE]``, an assistant message with neither content nor tool calls)
    stays stored, marked, and is left out of what is forwarded.
    """
    left_out: list[int] = []
    for i in range(start, len(history)):
        item = history[i]
        message = item.message
        role = message.get("role")
        if "type" in message or not isinstance(role, str) or role not in ROLES:
            raise InvalidRequest(
                f"Session {shown(session)} holds /v1/responses items, which a chat "
                "completions route with server-held history cannot replay; "
                "use another session id for chat completions.",
                param="session_id",
                code="session_conflict",
            )
        if role == "assistant" and (item.status != "complete" or empty_reply(message)):
            left_out.append(i)
    return left_out


def empty_reply(message: Mapping[str, Any]) -> bool:
    """An assistant message that says nothing: no content, tool calls, function call or refusal."""
    return not (
        message.get("content")
        or message.get("tool_calls")
        or message.get("function_call")
        or message.get("refusal")
    )


def valid_reply(message: dict[str, Any]) -> bool:
    """An upstream's assistant message has the shape a later request could replay."""
    if message.get("role", "assistant") != "assistant":
        return False
    try:
        _message({**message, "role": "assistant"}, "reply")
    except InvalidRequest:
        return False
    return True
