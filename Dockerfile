# ctxproxy: slim, non-root, offline at run time. The tokenizer files and the
# model map ship inside litellm; the proxy points tiktoken at them itself
# (proxy/context/model_info.py: offline_environment), so nothing is downloaded.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    LITELLM_LOCAL_MODEL_COST_MAP=True

WORKDIR /app
# The runtime lock first (its layer is cached until the lock changes): exactly the
# versions `make serve` runs (pip itself first), each checked against its hash; then the project alone.
COPY requirements-pip.lock requirements.lock ./
RUN pip install --require-hashes -r requirements-pip.lock \
    && pip install --require-hashes -r requirements.lock
COPY pyproject.toml README.md ./
COPY proxy ./proxy
COPY policies ./policies
RUN pip install --no-deps . \
    && useradd --system --uid 10001 --home-dir /app ctxproxy \
    && mkdir -p /app/data /config \
    && chown ctxproxy /app/data \
    # Fail the build now if the bundled encodings are not usable offline.
    && python -c "from proxy.context.model_info import offline_environment; offline_environment(); \
import tiktoken; tiktoken.get_encoding('o200k_base'); tiktoken.get_encoding('cl100k_base')"

COPY config.example.yaml /config/config.yaml
# Relative paths in a config are taken from its folder: keep the store on the volume.
RUN sed -i 's#path: ./data/ctxproxy.db#path: /app/data/ctxproxy.db#' /config/config.yaml \
    && grep -q 'path: /app/data/ctxproxy.db' /config/config.yaml
USER ctxproxy
EXPOSE 8080
VOLUME ["/app/data"]

HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
    CMD python -c "import urllib.request, sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2).status == 200 else 1)"

# The example config listens on 127.0.0.1; in a container we listen on all interfaces.
ENTRYPOINT ["python", "-m", "proxy", "--config", "/config/config.yaml", "--host", "0.0.0.0"]
