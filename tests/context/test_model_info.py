"""Model facts from litellm's bundled map, without importing litellm; what a summarizer may send."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from proxy.context.model_info import completion_params, context_window, is_reasoning_model

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("model", "window"),
    [
        ("gpt-4o", 128000),
        ("gpt-4o-mini", 128000),
        ("openai/gpt-4o", 128000),  # provider prefix
        ("ft:gpt-4o-mini:acme::abc123", 128000),  # fine-tuned: the base model's window
        ("gpt-5", 272000),
        ("claude-sonnet-4-5", 200000),
        ("anthropic/claude-sonnet-4-5", 200000),
        ("no-such-model-anywhere", None),
    ],
)
def test_context_window_comes_from_the_bundled_map(model, window):
    assert context_window(model) == window


def test_windows_agree_with_litellm_itself():
    import litellm

    for model in ("gpt-4o", "gpt-4.1", "gpt-5-mini", "o3", "o4-mini", "claude-sonnet-4-5"):
        info = litellm.get_model_info(model)
        assert context_window(model) == (info.get("max_input_tokens") or info.get("max_tokens")), (
            model
        )


def test_the_example_config_never_imports_litellm(tmp_path):
    """Serving a request on the example's context_fraction route reads the map, not litellm."""
    script = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        import httpx, yaml
        from proxy.config.loader import parse_config
        from tests.fakes.upstream import FakeUpstream
        from tests.harness import AiohttpServer, LoopThread, ProxyServer

        loop = LoopThread()
        fake = AiohttpServer(loop, FakeUpstream().app())
        data = yaml.safe_load(Path({str(REPO / "config.example.yaml")!r}).read_text())
        data["upstreams"]["openai"]["base_url"] = fake.url + "/v1"
        data["store"]["path"] = {str(tmp_path / "x.db")!r}
        proxy = ProxyServer(loop, parse_config(data))
        r = httpx.post(proxy.url + "/v1/chat/completions", headers={{"Authorization": "Bearer k"}},
                       json={{"model": "gpt-4.1", "messages": [{{"role": "user", "content": "hi"}}]}})
        assert r.status_code == 200, r.text
        assert r.headers["x-context-policy"] == "fit"
        proxy.stop()
        print("litellm" in sys.modules)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"


@pytest.mark.parametrize(
    ("model", "reasoning"),
    [
        ("gpt-4o", False),
        ("gpt-4.1-mini", False),
        ("gpt-5", True),
        ("gpt-5-mini", True),
        ("openai/gpt-5-nano", True),
        ("gpt-5-chat-latest", False),  # gpt-5's chat model takes a temperature
        ("o1", True),
        ("o3-mini", True),
        ("o4-mini", True),
        ("azure/o3", True),
        ("claude-sonnet-4-5", False),  # reasons, but takes a temperature
        ("omni-moderation-latest", False),
    ],
)
def test_reasoning_models_are_recognised(model, reasoning):
    assert is_reasoning_model(model) is reasoning


def test_completion_params_fit_each_family():
    assert completion_params("gpt-4o-mini", 400) == {"temperature": 0, "max_tokens": 400}
    gpt5 = completion_params("gpt-5", 400)
    assert "temperature" not in gpt5 and "max_tokens" not in gpt5
    assert gpt5["max_completion_tokens"] > 400  # room for the reasoning as well
    assert gpt5["reasoning_effort"] == "minimal"
    assert completion_params("o3", 400)["reasoning_effort"] == "low"
    assert "reasoning_effort" not in completion_params("o1-mini", 400)
    assert completion_params("gpt-5-chat-latest", 400) == {"temperature": 0, "max_tokens": 400}
