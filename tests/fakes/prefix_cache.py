"""A provider's prompt cache, simulated: what fraction of a prompt it would have served cached.

Two flavours, as the providers document them:

- **OpenAI-style** (automatic): every prompt's prefixes are remembered per cache
  key (``prompt_cache_key``, or one shared key without it). A request is
  served from cache up to the longest prefix some earlier request of the same
  key had, counted in the provider's units: nothing below 1,024 tokens, then
  128-token steps (1,024, 1,152, 1,280...).
- **Anthropic-style** (explicit): only prefixes that end at a ``cache_control``
  breakpoint are written. A request reads the longest written prefix that
  ends at a block boundary at or before one of its breakpoints (looking back
  at most 20 blocks from each, as Anthropic does), and writes the prefixes
  ending at its own breakpoints. Nothing after the last breakpoint is ever
  cached. Prefixes under the model's minimum (1,024 tokens) are not cached.

The prompt is a sequence of *blocks*, each a content hash and a token count
(a message, a system block, a tool definition): the simulation works at block
granularity, which is conservative (a provider also reuses a partial block).
Entries never expire (a replay is faster than any TTL). The fakes in this
package and ``bench/cache.py`` share it, so the tests and the bench measure
the same thing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

OPENAI_MINIMUM = 1024
OPENAI_STEP = 128
ANTHROPIC_MINIMUM = 1024
ANTHROPIC_LOOKBACK = 20

# A prompt block: its content hash and its tokens.
Block = tuple[str, int]


@dataclass(frozen=True)
class CacheResult:
    """What one request cost, in the provider's accounting."""

    prompt_tokens: int
    # Tokens served from the cache (read).
    cached_tokens: int
    # Tokens written to the cache (Anthropic's cache_creation_input_tokens; 0 for OpenAI).
    written_tokens: int = 0

    @property
    def uncached_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens - self.written_tokens


def openai_cached(prefix_tokens: int) -> int:
    """The tokens OpenAI reports cached for a matching prefix of ``prefix_tokens``."""
    if prefix_tokens < OPENAI_MINIMUM:
        return 0
    return OPENAI_MINIMUM + (prefix_tokens - OPENAI_MINIMUM) // OPENAI_STEP * OPENAI_STEP


def _chain(blocks: Sequence[Block], root: str) -> list[str]:
    """The hash of every prefix: ``out[i]`` identifies ``blocks[: i + 1]``."""
    out: list[str] = []
    h = root
    for key, _ in blocks:
        h = hashlib.blake2b(f"{h}/{key}".encode(), digest_size=12).hexdigest()
        out.append(h)
    return out


def _sums(blocks: Sequence[Block]) -> list[int]:
    out: list[int] = []
    total = 0
    for _, tokens in blocks:
        total += tokens
        out.append(total)
    return out


@dataclass
class OpenAIPrefixCache:
    """Automatic prefix caching per key, at 1,024-token minimum and 128-token steps."""

    seen: dict[str, set[str]] = field(default_factory=dict)

    def request(self, blocks: Sequence[Block], key: str = "") -> CacheResult:
        chain = _chain(blocks, "openai")
        sums = _sums(blocks)
        seen = self.seen.setdefault(key, set())
        longest = 0
        for i in range(len(chain) - 1, -1, -1):
            if chain[i] in seen:
                longest = sums[i]
                break
        seen.update(chain)
        total = sums[-1] if sums else 0
        # A request is never served entirely from cache: the provider needs its
        # last tokens to compute the answer; a repeated prompt loses its last step.
        cached = openai_cached(min(longest, total - 1))
        return CacheResult(prompt_tokens=total, cached_tokens=cached)


@dataclass
class AnthropicPrefixCache:
    """Explicit caching: reads and writes only at ``cache_control`` breakpoints."""

    minimum: int = ANTHROPIC_MINIMUM
    written: dict[str, set[str]] = field(default_factory=dict)

    def request(
        self, blocks: Sequence[Block], breakpoints: Sequence[int], key: str = ""
    ) -> CacheResult:
        """``breakpoints``: indexes of the blocks that carry ``cache_control``."""
        chain = _chain(blocks, "anthropic")
        sums = _sums(blocks)
        total = sums[-1] if sums else 0
        written = self.written.setdefault(key, set())
        marks = sorted({b for b in breakpoints if 0 <= b < len(blocks)})
        read = 0
        for b in marks:
            for i in range(b, max(-1, b - ANTHROPIC_LOOKBACK - 1), -1):
                if chain[i] in written:
                    read = max(read, sums[i])
                    break
        created = 0
        if marks:
            last = sums[marks[-1]]
            if last >= self.minimum and last > read:
                created = last - read
            for b in marks:
                if sums[b] >= self.minimum:
                    written.add(chain[b])
        return CacheResult(prompt_tokens=total, cached_tokens=read, written_tokens=created)
