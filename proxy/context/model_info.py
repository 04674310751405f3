"""Model facts from litellm's bundled model map, looked up lazily and cached.

litellm is slow to import (seconds), so it is only imported when a policy
needs a model's context window, never on the hot path of a plain route.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path


def offline_environment() -> None:
    """Make litellm and tiktoken work with no network: local price map, bundled encodings."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    if "TIKTOKEN_CACHE_DIR" not in os.environ:
        tokenizers = _litellm_tokenizers_dir()
        if tokenizers is not None:
            os.environ["TIKTOKEN_CACHE_DIR"] = str(tokenizers)


def _litellm_tokenizers_dir() -> Path | None:
    import importlib.util

    spec = importlib.util.find_spec("litellm")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "litellm_core_utils" / "tokenizers"
    return path if path.is_dir() else None


@functools.lru_cache(maxsize=1024)
def context_window(model: str) -> int | None:
    """Input tokens the model accepts, from litellm's model info; None when unknown."""
    offline_environment()
    import litellm

    try:
        info = litellm.get_model_info(model)
    except Exception:  # litellm raises a bare Exception for models it does not know
        return None
    value = info.get("max_input_tokens") or info.get("max_tokens")
    return int(value) if isinstance(value, int) and value > 0 else None
