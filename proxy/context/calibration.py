"""Token calibration: how far the local count is from what the upstream bills, per model.

tiktoken is exact for OpenAI models and an estimate for everything else
(Anthropic, Llama, Gemini behind litellm or an OpenAI-compatible server). After
each answer the upstream's ``usage.prompt_tokens`` is compared with the local
count of what was forwarded, and a running factor ``reported / local`` is
kept per model. Budgets are divided by it (see ``proxy.rewriter``), so a
route's ``max_tokens`` holds in the upstream's own tokens; the counts the
proxy reports and stores stay local, which keeps the ratio stable (scaling the
counts instead would feed the correction back into its own input).

A factor belongs to the model that answered, not to the name a client sent:
it is kept per upstream and the model its answers name (``model`` in the
completion), and a client's name is an alias learned from the first answer.
A server that lists exactly one model (``GET /v1/models``: llama.cpp and
llama-cpp-python serve one, whatever name they are sent, and echo the name
back) has every name calibrated as that model (:meth:`Calibration.serves`);
elsewhere a name never seen before, sent to an upstream that has only ever
answered as one model, gets that model's factor from its first request.

The factor is a token-weighted, exponentially decaying ratio of sums: big
prompts, where budgets bind, weigh more than a one-word greeting whose count is
all per-message overhead. It applies from the first answer (``min_samples``),
clamped to ``[low, high]``, so a buggy or cached usage report cannot make a
budget absurd.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from proxy.telemetry.metrics import CallbackGauge, Labels, Registry

ALPHA = 0.2
# From the first answer on: a budget that overshoots until a fifth answer is in
# overshoots where it matters most, on a new session's first long prompts.
MIN_SAMPLES = 1
LOW, HIGH = 0.5, 2.0
# Model names come from clients; only models the upstream answered are tracked.
MAX_MODELS = 256
# Between an upstream's name and its model's in a key (neither holds a tab).
_SEP = "\t"


def calibration_key(upstream: str | None, model: str) -> str:
    """The key a model's sums are kept under: per upstream, when it is known."""
    return model if upstream is None else f"{upstream}{_SEP}{model}"


def _split(key: str) -> tuple[str | None, str]:
    upstream, sep, model = key.partition(_SEP)
    return (upstream, model) if sep else (None, key)


def _labels(key: str) -> tuple[str, str]:
    upstream, model = _split(key)
    return upstream or "", model


@dataclass
class ModelCalibration:
    samples: int = 0
    # Exponentially decayed sums of reported and local prompt tokens.
    reported: float = 0.0
    local: float = 0.0
    last_reported: int = 0
    last_local: int = 0

    def ratio(self) -> float:
        return self.reported / self.local if self.local > 0 else 1.0


class Calibration:
    def __init__(
        self,
        *,
        alpha: float = ALPHA,
        min_samples: int = MIN_SAMPLES,
        low: float = LOW,
        high: float = HIGH,
        max_models: int = MAX_MODELS,
    ) -> None:
        self.alpha = alpha
        self.min_samples = min_samples
        self.low = low
        self.high = high
        self.max_models = max_models
        # By calibration_key(upstream, answering model).
        self.models: dict[str, ModelCalibration] = {}
        # (upstream, client's model name) -> the key of the model that answered it.
        self._aliases: dict[tuple[str, str], str] = {}
        # Per upstream, the keys of the models it answered as.
        self._answered: dict[str, set[str]] = {}
        # Upstreams that list one model only: its key (whatever name a client sends).
        self._single: dict[str, str] = {}
        # Applied factors by model, kept apart so the hot path is one dict lookup.
        self._factors: dict[str, float] = {}
        # Shared by several instances (proxy/coordination/calibration_share.py):
        # factors come only from ``adopt``, so every instance applies the same.
        self.shared = False

    def key(self, model: str, upstream: str | None = None) -> str:
        """The key a request for ``model`` through ``upstream`` is calibrated under."""
        if upstream is None:
            return model
        single = self._single.get(upstream)
        if single is not None:
            return single
        known = self._aliases.get((upstream, model))
        if known is not None:
            return known
        answered = self._answered.get(upstream)
        if answered is not None and len(answered) == 1:
            # One model behind this upstream so far: a new name reaches it too.
            return next(iter(answered))
        return calibration_key(upstream, model)

    def learn(self, upstream: str | None, model: str, answered_as: str | None) -> str:
        """Remember which model answered ``model`` through ``upstream``; its key."""
        if upstream is None:
            return model
        key = self._single.get(upstream) or calibration_key(upstream, answered_as or model)
        if (upstream, model) not in self._aliases and len(self._aliases) < self.max_models * 4:
            self._aliases[(upstream, model)] = key
        answered = self._answered.setdefault(upstream, set())
        if len(answered) < self.max_models:
            answered.add(key)
        return key

    def ambiguous(self, upstream: str) -> bool:
        """Whether the upstream answered as several models (one server may echo names)."""
        return upstream not in self._single and len(self._answered.get(upstream, ())) > 1

    def serves(self, upstream: str, models: list[str]) -> None:
        """What the upstream lists at ``/v1/models``: one model there is every name's."""
        if len(models) != 1 or upstream in self._single:
            return
        single = self._single[upstream] = calibration_key(upstream, models[0])
        # What was kept under the names it echoed is that one model's: merged.
        merged = self.models.get(single) or ModelCalibration()
        for key in self._answered.get(upstream, set()) - {single}:
            entry = self.models.pop(key, None)
            self._factors.pop(key, None)
            if entry is not None:
                merged.reported += entry.reported
                merged.local += entry.local
                merged.samples += entry.samples
                merged.last_reported, merged.last_local = entry.last_reported, entry.last_local
        self._answered[upstream] = {single}
        self._aliases = {k: single if k[0] == upstream else v for k, v in self._aliases.items()}
        if merged.samples:
            self.models[single] = merged
            if merged.samples >= self.min_samples and not self.shared:
                self._factors[single] = min(self.high, max(self.low, merged.ratio()))

    def observe(self, model: str, local: int, reported: int) -> None:
        """One answer: ``local`` tokens forwarded (as counted here), ``reported`` billed.

        ``model``: a key (:meth:`key`, :meth:`learn`), or a bare model name."""
        if local <= 0 or reported <= 0:
            return
        entry = self.models.get(model)
        if entry is None:
            if len(self.models) >= self.max_models:
                return
            entry = self.models[model] = ModelCalibration()
        keep = 1.0 - self.alpha
        entry.reported = entry.reported * keep + reported
        entry.local = entry.local * keep + local
        entry.samples += 1
        entry.last_reported, entry.last_local = reported, local
        if entry.samples >= self.min_samples and not self.shared:
            self._factors[model] = min(self.high, max(self.low, entry.ratio()))

    def state(self) -> dict[str, tuple[float, float, int]]:
        """This instance's decayed sums per model: (reported, local, samples)."""
        return {m: (e.reported, e.local, e.samples) for m, e in self.models.items()}

    def adopt(self, states: list[dict[str, tuple[float, float, int]]]) -> None:
        """Apply factors from every instance's sums (this one's included), summed per model.

        Instances that adopt the same states apply the same factors.
        """
        totals: dict[str, list[float]] = {}
        for state in states:
            for model, (reported, local, samples) in state.items():
                t = totals.setdefault(model, [0.0, 0.0, 0.0])
                t[0] += reported
                t[1] += local
                t[2] += samples
        self._factors = {
            model: min(self.high, max(self.low, reported / local))
            for model, (reported, local, samples) in totals.items()
            if samples >= self.min_samples and local > 0
        }

    def observe_usage(
        self,
        model: str | None,
        local: int,
        usage: Any,
        *,
        upstream: str | None = None,
        answered_as: str | None = None,
    ) -> None:
        """``observe`` from an answer's ``usage`` object, when it has prompt tokens.

        ``answered_as``: the model the answer names (the one that billed)."""
        if model is None or not isinstance(usage, dict):
            return
        reported = usage.get("prompt_tokens")
        if not isinstance(reported, int) or isinstance(reported, bool):
            return
        if reported > 0 and local > 0:
            self.observe(self.learn(upstream, model, answered_as), local, reported)

    def factor(self, model: str, upstream: str | None = None) -> float:
        """The factor budgets are divided by: 1.0 until enough samples are in."""
        return self._factors.get(self.key(model, upstream), 1.0)

    def snapshot(self) -> list[dict[str, Any]]:
        """Every tracked model, for the admin API."""
        clients: dict[str, set[str]] = {}
        for (_, name), key in self._aliases.items():
            clients.setdefault(key, set()).add(name)
        return [
            {
                "model": _split(model)[1],
                "upstream": _split(model)[0],
                # The names clients used for it (what request rows say).
                "client_models": sorted(clients.get(model, ())),
                "factor": round(self._factors.get(model, 1.0), 4),
                "measured": round(entry.ratio(), 4),
                "samples": entry.samples,
                "applied": model in self._factors,
                "last_local_tokens": entry.last_local,
                "last_reported_tokens": entry.last_reported,
            }
            for model, entry in sorted(self.models.items())
        ]

    def register(self, registry: Registry) -> None:
        """Expose the factors and sample counts as gauges, read at scrape time."""
        registry.add(
            CallbackGauge(
                "ctxproxy_token_calibration_factor",
                "Upstream-reported over local prompt tokens, per upstream and answering model.",
                ("upstream", "model"),
                self.factor_samples,
            )
        )
        registry.add(
            CallbackGauge(
                "ctxproxy_token_calibration_samples",
                "Answers with usage compared against the local count, per model.",
                ("upstream", "model"),
                self.sample_counts,
            )
        )

    def factor_samples(self) -> Iterator[tuple[Labels, float]]:
        for model in self.models:
            yield _labels(model), self._factors.get(model, 1.0)

    def sample_counts(self) -> Iterator[tuple[Labels, float]]:
        for model, entry in self.models.items():
            yield _labels(model), float(entry.samples)
