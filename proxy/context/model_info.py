"""Model facts from litellm's bundled model map, read without importing litellm.

``import litellm`` costs seconds and ~200 MB; the map it reads is one JSON
file in its package (``model_prices_and_context_window_backup.json``, what
``LITELLM_LOCAL_MODEL_COST_MAP=True`` loads). Parsing that file with orjson
takes ~30 ms, once, on the first lookup, so a route with ``context_fraction``
no longer pulls litellm into the process. A name the file does not know is
asked of litellm itself only when litellm is already loaded (a provider
upstream or the Responses bridge imported it).

What the map says about a model also decides what the summarizer may send
(:func:`completion_params`): reasoning models (o-series, gpt-5) reject
``temperature`` and ``max_tokens``.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import sys
from pathlib import Path
from typing import Any

import orjson

MODEL_MAP_FILE = "model_prices_and_context_window_backup.json"
# Room for a reasoning model's hidden reasoning on top of the visible answer:
# ``max_completion_tokens`` bounds both, and a summary cut short is useless.
REASONING_HEADROOM = 2048
_O_SERIES = re.compile(r"^o\d")


def offline_environment() -> None:
    """Make litellm and tiktoken work with no network: local price map, bundled encodings."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    if "TIKTOKEN_CACHE_DIR" not in os.environ:
        tokenizers = _litellm_dir("litellm_core_utils", "tokenizers")
        if tokenizers is not None:
            os.environ["TIKTOKEN_CACHE_DIR"] = str(tokenizers)


def _litellm_dir(*parts: str) -> Path | None:
    # find_spec locates the package without running its (slow) __init__.
    spec = importlib.util.find_spec("litellm")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent.joinpath(*parts)
    return path if path.exists() else None


@functools.lru_cache(maxsize=1)
def _model_map() -> dict[str, Any]:
    path = _litellm_dir(MODEL_MAP_FILE)
    if path is None:
        return {}
    data = orjson.loads(path.read_bytes())
    return data if isinstance(data, dict) else {}


def load_model_map() -> int:
    """Read the map now (start-up, off the event loop); the number of models it knows."""
    return len(_model_map())


def _names(model: str) -> list[str]:
    """The keys a model may be listed under: as given, lower-cased, without provider prefix."""
    names = [model, model.lower()]
    if model.startswith("ft:"):  # fine-tuned: ft:gpt-4o-mini:org::id is a gpt-4o-mini
        names.append(model.split(":")[1])
    if "/" in model:
        names += [model.split("/", 1)[1], model.rsplit("/", 1)[1]]
    return names


@functools.lru_cache(maxsize=1024)
def model_entry(model: str) -> dict[str, Any] | None:
    """The map's entry for a model, or None when it is not listed."""
    table = _model_map()
    for name in _names(model):
        entry = table.get(name)
        if isinstance(entry, dict):
            return entry
    if "litellm" in sys.modules:  # already paid for: let it resolve aliases and providers
        try:
            info = sys.modules["litellm"].get_model_info(model)
        except Exception:  # litellm raises a bare Exception for models it does not know
            return None
        return dict(info) if isinstance(info, dict) else None
    return None


@functools.lru_cache(maxsize=1024)
def context_window(model: str) -> int | None:
    """Input tokens the model accepts; None when unknown."""
    info = model_entry(model)
    if info is None:
        return None
    value = info.get("max_input_tokens") or info.get("max_tokens")
    return int(value) if isinstance(value, int) and value > 0 else None


def is_reasoning_model(model: str) -> bool:
    """An OpenAI reasoning model: fixed temperature, ``max_completion_tokens`` only.

    By name, as litellm's own OpenAI config decides (o1, o3, o4-mini...;
    gpt-5 and later, except the gpt-5-chat models, which are not reasoning
    models), with the map's ``supports_reasoning`` for OpenAI models named
    otherwise. Other providers' reasoning models (Claude, Gemini) accept a
    temperature, so they are not counted here.
    """
    name = model.rsplit("/", 1)[-1].lower()
    if name.startswith("ft:"):
        name = name.split(":")[1]
    if "gpt-5-chat" in name:
        return False
    if _O_SERIES.match(name) or re.match(r"^gpt-([5-9]|\d\d)", name):
        return True
    info = model_entry(model) or {}
    return info.get("litellm_provider") == "openai" and info.get("supports_reasoning") is True


def completion_params(model: str, max_tokens: int) -> dict[str, Any]:
    """Sampling and length fields a chat completion to this model may carry.

    A reasoning model gets ``max_completion_tokens`` (answer plus reasoning
    headroom), the lowest reasoning effort it accepts, and no temperature;
    any other model ``temperature: 0`` and ``max_tokens``.
    """
    if not is_reasoning_model(model):
        return {"temperature": 0, "max_tokens": max_tokens}
    params: dict[str, Any] = {"max_completion_tokens": max_tokens + REASONING_HEADROOM}
    name = model.rsplit("/", 1)[-1].lower()
    if name.startswith(("o1-mini", "o1-preview")) or "-pro" in name:
        return params  # no effort setting (o1-mini), or only its own (the pro models)
    info = model_entry(model) or {}
    minimal = info.get("supports_minimal_reasoning_effort") is True
    params["reasoning_effort"] = "minimal" if minimal else "low"
    return params
