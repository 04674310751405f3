"""Who answers: the Upstream protocol (base), OpenAI-compatible over aiohttp
(openai_compat), any provider through litellm (provider, litellm_support).

May import: proxy.errors and proxy.telemetry; never config, store or anything above.
"""
