"""Token counts for chat requests: tiktoken with litellm's bundled files, cached per message.

Counts follow OpenAI's cookbook: 3 tokens per message, every string field
encoded (role, content, name, tool_call_id...), 1 more for ``name``, and 3
for priming the reply. What the cookbook leaves open is estimated here and
documented by the constant that holds it; ``scale`` lets calibration against
the upstream's reported usage correct the lot.

litellm is deliberately not imported (its import takes seconds); only its
bundled tokenizer files are used, through ``TIKTOKEN_CACHE_DIR``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import math
import os
import re
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

import orjson
import tiktoken

from proxy.heap import release_freed_heap

PER_MESSAGE = 3
PER_NAME = 1
REPLY_PRIMING = 3
# Wrapper tokens around one tool call's name and arguments (estimate).
PER_TOOL_CALL = 3
# Around the rendered tool namespace (litellm's constant).
TOOLS_OVERHEAD = 9
# A named tool_choice / function_call (litellm's constant, plus the name).
NAMED_CHOICE = 7
# Images are not fetched to size them: ``detail: low`` is a flat 85; anything
# else is priced as a 1024x1024 image at high detail (85 + 4 tiles x 170).
IMAGE_LOW = 85
IMAGE_DEFAULT = 765
# Audio and file parts: a placeholder of one default image until calibrated.
MEDIA_ESTIMATE = 765
# A content part whose price in tokens a front door computed: {"type": PRICED_PART,
# "tokens": n} (proxy/messages/media.py prices Anthropic's images and documents).
PRICED_PART = "ctxproxy_priced"
CACHE_SIZE = 100_000
# The encodings litellm bundles; anything else would be downloaded.
SUPPORTED_ENCODINGS = ("o200k_base", "cl100k_base")

_O200K_MODELS = re.compile(r"(?:ft:)?(?:gpt-4o|chatgpt-4o|gpt-4\.1|gpt-4\.5|gpt-5|gpt-oss|o[1-9])")
_SORTED = orjson.OPT_SORT_KEYS


class TokenCounter(Protocol):
    encoding_name: str
    # Calibration factor: every count is ceil(raw * scale).
    scale: float

    def count_message(self, message: Mapping[str, Any], key: Hashable | None = None) -> int: ...

    def cached_count(self, key: Hashable) -> int | None:
        """The count of the content ``key`` names when it is cached (no tokenizing)."""
        ...

    def count_messages(self, messages: Iterable[Mapping[str, Any]]) -> int: ...

    def count_tools(self, tools: list[Any] | None) -> int: ...

    def count_request_fixed(self, body: Mapping[str, Any]) -> int: ...


class Encoder(Protocol):
    """The part of a tiktoken Encoding a counter uses (tests wrap it)."""

    name: str

    def encode_ordinary(self, text: str) -> list[int]: ...


def encoding_name_for(model: str) -> str:
    """The encoding litellm and tiktoken use for ``model``; cl100k_base when unknown.

    A provider prefix (``openai/``, ``azure/eu/``) is ignored.
    """
    name = model.rsplit("/", 1)[-1].strip().lower()
    if _O200K_MODELS.match(name):
        return "o200k_base"
    try:
        found = tiktoken.encoding_name_for_model(name)
    except KeyError:
        return "cl100k_base"
    return found if found in SUPPORTED_ENCODINGS else "cl100k_base"


_ENCODINGS: dict[str, Encoder] = {}


def load_encoding(name: str) -> Encoder:
    """An encoding, loaded once per process from litellm's bundled files."""
    encoding = _ENCODINGS.get(name)
    if encoding is None:
        _default_cache_dir()
        loaded = tiktoken.get_encoding(name)
        _drop_python_ranks(loaded)
        encoding = _ENCODINGS[name] = loaded
    return encoding


def _drop_python_ranks(encoding: tiktoken.Encoding) -> None:
    # tiktoken keeps the Python dict of the merge ranks (200k bytes keys for
    # o200k_base) beside the Rust tokenizer built from it, which holds its own
    # copy; only pickling an Encoding reads the dict. Dropping it saves ~36 MB
    # of RSS for the two encodings (bench/history.py, memory); tests check the
    # counts are unchanged.
    if isinstance(getattr(encoding, "_mergeable_ranks", None), dict):
        encoding._mergeable_ranks = {}


def preload_encodings() -> None:
    """Load every supported encoding now (the app does, in a thread, at start-up)."""
    for name in SUPPORTED_ENCODINGS:
        load_encoding(name)
    # Loading parses each encoding's file in Python (hundreds of thousands of
    # short-lived objects, then the ranks dict dropped above): ~6 MB of RSS back.
    release_freed_heap()


def _default_cache_dir() -> None:
    # The app sets TIKTOKEN_CACHE_DIR; if nobody did, point it at litellm's
    # files anyway, because tiktoken would otherwise download on the hot path.
    if os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR"):
        return
    spec = importlib.util.find_spec("litellm")
    if spec is not None and spec.origin is not None:
        tokenizers = Path(spec.origin).parent / "litellm_core_utils" / "tokenizers"
        os.environ["TIKTOKEN_CACHE_DIR"] = str(tokenizers)


class CountCache:
    """Raw counts by message content, least recently used evicted first.

    Keys are Python's hash of the message's canonical JSON (plus its length):
    a fast hash with a per-process key; a collision would cost one wrong
    count, never wrong content.
    """

    def __init__(self, maxsize: int = CACHE_SIZE) -> None:
        self.maxsize = maxsize
        self._data: OrderedDict[Hashable, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._data)

    @property
    def entries(self) -> OrderedDict[Hashable, int]:
        """The counts by key, least recently used first (read, and touched, in place)."""
        return self._data

    def get(self, key: Hashable) -> int | None:
        value = self._data.get(key)
        if value is not None:
            self._data.move_to_end(key)
        return value

    def put(self, key: Hashable, value: int) -> None:
        self._data[key] = value
        if len(self._data) > self.maxsize:
            self._data.popitem(last=False)


_CACHES: dict[str, CountCache] = {}

# What one cached count holds (tracemalloc, at the ordered dict's fullest just
# past a resize): its entry, node and table slots (~90 bytes), its key (a
# content hash string, 81 bytes, that nothing else holds once the message
# cache evicted its session; or a tuple of two ints, 88) and the count when
# over 256 (32): 208 to 235 bytes. At 200 the share held ~17% more than it
# was given (bench/history.py, memory: the count cache was most of what grew
# from 1,000 to 5,000 sessions); a test checks this against tracemalloc.
COUNT_BYTES = 240


def set_count_budget(max_bytes: int) -> None:
    """Bound the process's count caches (every encoding's together) to ``max_bytes``."""
    each = max(1, max_bytes // COUNT_BYTES // len(SUPPORTED_ENCODINGS))
    for name in SUPPORTED_ENCODINGS:
        cache = _CACHES.setdefault(name, CountCache(each))
        cache.maxsize = each
        while len(cache._data) > each:
            cache._data.popitem(last=False)


# Texts this long are counted in pieces, and before the request's counting, in a
# worker thread (TiktokenCounter.precount). BPE over one pre-token (a long run
# without spaces) grows with its square: 8 KiB of one word takes 4 ms where 1 KiB takes 0.17, 24 MiB
# took 28 s on the event loop. Pieces of at most LONG_PIECE characters, cut
# before a space where there is one, count a text as one pass would (a
# pre-token starts at its leading space) and bound the work to linear.
LONG_TEXT = 32 * 1024
LONG_PIECE = 1024
# Counts of long texts by (length, hash), per encoding.
LONG_CACHE = 1024
_LONG: dict[str, OrderedDict[tuple[int, int], int]] = {}


def count_long(encoding: Encoder, text: str) -> int:
    """Tokens of a long text, counted piece by piece (thread-safe: no shared state)."""
    total = 0
    start, end = 0, len(text)
    while start < end:
        stop = min(start + LONG_PIECE, end)
        if stop < end:
            cut = text.rfind(" ", start + LONG_PIECE // 2, stop)
            if cut > start:
                stop = cut
        total += len(encoding.encode_ordinary(text[start:stop]))
        start = stop
    return total


def long_texts(messages: Iterable[Mapping[str, Any]]) -> Iterable[str]:
    """The texts of chat messages (or items) long enough to count in pieces."""
    for message in messages:
        for key in ("content", "output", "arguments"):
            value = message.get(key)
            if isinstance(value, str):
                if len(value) >= LONG_TEXT:
                    yield value
            elif isinstance(value, list):
                for part in value:
                    text = part.get("text") if isinstance(part, Mapping) else None
                    if isinstance(text, str) and len(text) >= LONG_TEXT:
                        yield text
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            for call in calls:
                fn = call.get("function") if isinstance(call, Mapping) else None
                arguments = fn.get("arguments") if isinstance(fn, Mapping) else None
                if isinstance(arguments, str) and len(arguments) >= LONG_TEXT:
                    yield arguments


def _key(value: object, kind: bytes = b"") -> tuple[int, int]:
    if not kind and type(value) is dict:
        if len(value) == 2:
            role, content = value.get("role"), value.get("content")
            if type(role) is str and type(content) is str:
                # {role, content} (most messages): the two hashed as they are, no items
                # sorted (-2: a key of its own, never equal to the general one's).
                return -2, hash((role, content))
        for item in value.values():
            if item is not None and type(item) is not str:
                break
        else:
            # Any other message of strings (a tool result, a named one): its items
            # hashed as a set, in no order as the JSON below is in key order, none
            # written (-1: never a length, so never such a key).
            return -1, hash(frozenset(value.items()))
    try:
        data = kind + orjson.dumps(value, option=_SORTED, default=_jsonable)
    except TypeError:  # orjson's JSONEncodeError: e.g. an integer over 64 bits
        data = kind + repr(value).encode()
    return len(data), hash(data)


def _jsonable(value: object) -> object:
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"not JSON: {type(value).__name__}")


class TiktokenCounter:
    """A :class:`TokenCounter` for one model; use :func:`counter_for` to share one.

    Counters of the same encoding share one cache of raw counts, so a message
    is tokenized once per process whichever model it is sent to. A counter
    given its own ``encoding`` (tests) gets its own cache.
    """

    def __init__(self, model: str, *, encoding: Encoder | None = None) -> None:
        self.model = model
        self.scale = 1.0
        if encoding is None:
            self.encoding_name = encoding_name_for(model)
            self._encoding = load_encoding(self.encoding_name)
            self._cache = _CACHES.setdefault(self.encoding_name, CountCache())
            self._long = _LONG.setdefault(self.encoding_name, OrderedDict())
        else:
            self.encoding_name = encoding.name
            self._encoding = encoding
            self._cache = CountCache()
            self._long = OrderedDict()

    def _scaled(self, raw: int) -> int:
        return raw if self.scale == 1.0 else math.ceil(raw * self.scale)

    def count_message(self, message: Mapping[str, Any], key: Hashable | None = None) -> int:
        return self._scaled(self.raw_message(message, key))

    def count_messages(self, messages: Iterable[Mapping[str, Any]]) -> int:
        return sum(self.count_message(m) for m in messages)

    def count_all(self, messages: Iterable[Mapping[str, Any]]) -> list[int]:
        """Each message's :meth:`count_message`, in one pass (a request's messages)."""
        # The cache's dict itself: a request's messages are looked up with no call each.
        seen, put = self._cache.entries, self._cache.put
        get, touch = seen.get, seen.move_to_end
        counts: list[int] = []
        for message in messages:
            key = _key(message)
            raw = get(key)
            if raw is None:
                raw = self._message_tokens(message)
                put(key, raw)
            else:
                touch(key)
            counts.append(raw)
        return counts if self.scale == 1.0 else [self._scaled(raw) for raw in counts]

    def cached_count(self, key: Hashable) -> int | None:
        raw = self._cache.get(key)
        return None if raw is None else self._scaled(raw)

    def raw_message(self, message: Mapping[str, Any], key: Hashable | None = None) -> int:
        """The unscaled count, from the cache when this content was counted before.

        ``key``: the caller's own identity for this content (the session
        layer's content hash), so a message is serialised and hashed once per
        request, not once for storage and again for counting.
        """
        if key is None:
            key = _key(message)
        raw = self._cache.get(key)
        if raw is None:
            raw = self._message_tokens(message)
            self._cache.put(key, raw)
        return raw

    def count_tools(self, tools: list[Any] | None) -> int:
        """Tokens of the ``tools`` definitions, as OpenAI renders function tools."""
        if not tools:
            return 0
        return self._scaled(self._cached(b"tools", tools, self._tools_tokens))

    def count_functions(self, functions: list[Any] | None) -> int:
        """Tokens of the legacy ``functions`` definitions."""
        if not functions:
            return 0
        return self._scaled(self._cached(b"functions", functions, self._functions_tokens))

    def count_request_fixed(self, body: Mapping[str, Any]) -> int:
        """What a request costs besides its messages: tools, functions, a named choice, priming."""
        choice = body.get("tool_choice") or body.get("function_call")
        return (
            self.count_tools(body.get("tools"))
            + self.count_functions(body.get("functions"))
            + self._scaled(self._choice_tokens(choice))
            + REPLY_PRIMING
        )

    # Counting, uncached (long texts excepted: see LONG_TEXT).

    def _text(self, text: str) -> int:
        if len(text) >= LONG_TEXT:
            return self._long_text(text)
        return len(self._encoding.encode_ordinary(text))

    def _long_text(self, text: str) -> int:
        key = (len(text), hash(text))
        raw = self._long.get(key)
        if raw is None:
            raw = self._long[key] = count_long(self._encoding, text)
            if len(self._long) > LONG_CACHE:
                self._long.popitem(last=False)
        return raw

    async def precount(self, messages: Iterable[Mapping[str, Any]]) -> None:
        """Count the long texts of ``messages`` in a worker thread, so the counts that
        follow on the event loop find them done and other requests keep their latency."""
        todo = [t for t in long_texts(messages) if (len(t), hash(t)) not in self._long]
        if not todo:
            return
        encoding = self._encoding
        counts = await asyncio.to_thread(lambda: [count_long(encoding, t) for t in todo])
        for text, raw in zip(todo, counts, strict=True):
            self._long[(len(text), hash(text))] = raw
        while len(self._long) > LONG_CACHE:
            self._long.popitem(last=False)

    async def precount_messages(self, messages: Sequence[Mapping[str, Any]]) -> int:
        """Count and cache ``messages`` (strings only, none long: see LONG_TEXT) that
        the cache does not hold, the tokenizing in a worker thread, so a later
        :meth:`count_message` of the same content is a hit. Returns how many were counted."""
        todo: list[tuple[Hashable, Mapping[str, Any]]] = []
        data = self._cache._data
        for message in messages:
            if not all(type(v) is str and len(v) < LONG_TEXT for v in message.values()):
                continue
            key = _key(message)
            if key not in data:
                todo.append((key, message))
        if not todo:
            return 0
        tokens = self._message_tokens  # strings shorter than LONG_TEXT: no shared state
        raws = await asyncio.to_thread(lambda: [tokens(m) for _, m in todo])
        for (done, _), raw in zip(todo, raws, strict=True):
            self._cache.put(done, raw)
        return len(todo)

    def _cached(self, kind: bytes, value: list[Any], tokens: Callable[[list[Any]], int]) -> int:
        key = _key(value, kind)
        raw = self._cache.get(key)
        if raw is None:
            raw = tokens(value)
            self._cache.put(key, raw)
        return raw

    def _message_tokens(self, message: Mapping[str, Any]) -> int:
        tokens = PER_MESSAGE
        for key, value in message.items():
            if value is None:
                continue
            if key == "content":
                tokens += self._content_tokens(value)
            elif key == "tool_calls" and isinstance(value, list):
                tokens += sum(self._call_tokens(call.get("function")) for call in _mappings(value))
            elif key == "function_call":
                tokens += self._call_tokens(value)
            elif isinstance(value, str):
                tokens += self._text(value) + (PER_NAME if key == "name" else 0)
            # Other structured fields (audio references, annotations) are not
            # shown to the model as text; litellm skips them too.
        return tokens

    def _content_tokens(self, content: object) -> int:
        if isinstance(content, str):
            return self._text(content)
        if isinstance(content, list):
            return sum(self._part_tokens(part) for part in content)
        return self._text(_dumps(content))

    def _part_tokens(self, part: object) -> int:
        if not isinstance(part, Mapping):
            return self._text(_dumps(part))
        kind = part.get("type")
        if kind in ("text", "refusal", "input_text", "output_text"):
            text = part.get(kind if kind == "refusal" else "text")
            return self._text(text) if isinstance(text, str) else 0
        if kind == PRICED_PART:
            # A door that knows what a part costs (Anthropic's images) says so.
            priced = part.get("tokens")
            return priced if isinstance(priced, int) and priced >= 0 else MEDIA_ESTIMATE
        if kind in ("image_url", "input_image"):
            image = part.get("image_url")
            detail = image.get("detail") if isinstance(image, Mapping) else part.get("detail")
            return IMAGE_LOW if detail == "low" else IMAGE_DEFAULT
        if kind in ("input_audio", "file", "input_file"):
            return MEDIA_ESTIMATE
        return self._text(_dumps(part))

    def _call_tokens(self, call: object) -> int:
        if not isinstance(call, Mapping):
            return PER_TOOL_CALL
        name = call.get("name")
        arguments = call.get("arguments")
        return (
            PER_TOOL_CALL
            + (self._text(name) if isinstance(name, str) else 0)
            + (self._text(arguments if isinstance(arguments, str) else _dumps(arguments)))
        )

    def _choice_tokens(self, choice: object) -> int:
        if choice == "none":
            return 1
        if isinstance(choice, Mapping):
            function = choice.get("function")
            name = function.get("name") if isinstance(function, Mapping) else choice.get("name")
            if isinstance(name, str):
                return NAMED_CHOICE + self._text(name)
        return 0

    def _tools_tokens(self, tools: list[Any]) -> int:
        functions = [t.get("function") for t in _mappings(tools)]
        others = [t for t in tools if not (isinstance(t, Mapping) and t.get("function"))]
        return self._functions_tokens([f for f in functions if f]) + sum(
            self._text(_dumps(t)) for t in others
        )

    def _functions_tokens(self, functions: list[Any]) -> int:
        rendered = render_functions(list(_mappings(functions)))
        return self._text(rendered) + TOOLS_OVERHEAD if rendered else 0


@lru_cache(maxsize=256)
def counter_for(model: str) -> TiktokenCounter:
    """The process's counter for ``model`` (bounded: model names come from clients)."""
    return TiktokenCounter(model)


def _mappings(values: Iterable[object]) -> Iterable[Mapping[str, Any]]:
    return (v for v in values if isinstance(v, Mapping))


def _dumps(value: object) -> str:
    try:
        return orjson.dumps(value, default=_jsonable).decode()
    except TypeError:  # not JSON after all: count what it prints as
        return str(value)


# OpenAI shows function tools to the model as a TypeScript namespace; counting
# that rendering (as litellm does) is closer than counting the JSON schema.


def render_functions(functions: list[Mapping[str, Any]]) -> str:
    lines = ["namespace functions {", ""]
    for function in functions:
        name = function.get("name")
        if not name:
            continue
        description = function.get("description")
        if description:
            lines.append(f"// {description}")
        parameters = function.get("parameters")
        if isinstance(parameters, Mapping) and parameters.get("properties"):
            lines += [f"type {name} = (_: {{", _render_object(parameters, 0), "}) => any;"]
        else:
            lines.append(f"type {name} = () => any;")
        lines.append("")
    if len(lines) == 2:
        return ""
    lines.append("} // namespace functions")
    return "\n".join(lines)


def _render_object(schema: Mapping[str, Any], indent: int) -> str:
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):
        return ""
    required = schema.get("required")
    required = required if isinstance(required, list) else []
    lines: list[str] = []
    for key, prop in properties.items():
        description = prop.get("description") if isinstance(prop, Mapping) else None
        if description:
            lines.append(f"// {description}")
        optional = "" if key in required else "?"
        lines.append(f"{key}{optional}: {_render_type(prop, indent)},")
    return "\n".join(" " * indent + line for line in lines)


def _render_type(prop: object, indent: int) -> str:
    # Depth is bounded: schemas come from clients.
    if not isinstance(prop, Mapping) or indent > 32:
        return "any"
    kind = prop.get("type")
    enum = prop.get("enum")
    if isinstance(enum, list) and kind in ("string", "integer", "number"):
        return " | ".join(f'"{item}"' for item in enum)
    if kind == "array":
        return f"{_render_type(prop.get('items'), indent)}[]"
    if kind == "object" and isinstance(prop.get("properties"), Mapping):
        return f"{{\n{_render_object(prop, indent + 2)}\n}}"
    variants = prop.get("anyOf") or prop.get("oneOf")
    if isinstance(variants, list) and variants:
        return " | ".join(_render_type(v, indent) for v in variants)
    return _SIMPLE_TYPES.get(kind, "any") if isinstance(kind, str) else "any"


_SIMPLE_TYPES = {
    "string": "string",
    "integer": "number",
    "number": "number",
    "boolean": "boolean",
    "null": "null",
    "object": "object",
}
