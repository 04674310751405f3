"""Command line: `python -m proxy [serve] --config PATH`, `python -m proxy check --config PATH`.

Also `python -m proxy sessions list|show|delete|export ...` and
`python -m proxy replay FILE --config PATH --policy NAME` (see proxy/ops/cli.py).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import sys
from collections.abc import Sequence

from proxy.config.loader import load_config
from proxy.config.model import Config
from proxy.errors import ConfigError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m proxy", description=__doc__)
    sub = parser.add_subparsers(dest="command")
    for name, help_text in (
        ("serve", "start the proxy (the default)"),
        ("check", "validate a config file and exit"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--config", required=True, help="path to the YAML config")
        if name == "serve":
            p.add_argument("--host", help="override server.host")
            p.add_argument("--port", type=int, help="override server.port")
    return parser


def _load(path: str) -> Config | None:
    try:
        return load_config(path)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return None


def serve(config: Config, host: str | None, port: int | None) -> None:
    import uvicorn

    from proxy.app import create_app
    from proxy.telemetry.logging import configure_logging

    configure_logging(config.logging.level, config.logging.format)
    app = create_app(config)
    # What is built by now lives as long as the process: move it out of the
    # collector's sight, and collect less often. Each full collection would
    # otherwise pause the event loop for 10 ms or more (litellm alone brings
    # hundreds of thousands of objects). Here, not in create_app: a process
    # that builds many apps (the tests) must not freeze each one's garbage.
    gc.collect()
    gc.freeze()
    gc.set_threshold(7000, 10, 10)
    uvicorn.run(
        app,
        host=host or config.server.host,
        port=port or config.server.port,
        # The fast event loop and HTTP parser, named: "auto" would fall back to
        # the slow ones silently. uvloop is not installed on Windows.
        loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        http="httptools",
        log_level="warning",
        access_log=False,
        server_header=False,
        date_header=False,
        timeout_graceful_shutdown=30,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("sessions", "replay"):
        from proxy.ops import cli

        return cli.main(args)
    if not args or (args[0].startswith("-") and args[0] not in ("-h", "--help")):
        args.insert(0, "serve")
    ns = _parser().parse_args(args)
    config = _load(ns.config)
    if config is None:
        return 2
    if ns.command == "check":
        print(
            f"ok: {ns.config}: {len(config.upstreams)} upstream(s), {len(config.routes)} route(s), "
            f"{len(config.policies)} policies"
        )
        from proxy.ops.check import describe

        for line in describe(config):
            print(f"  {line}")
        return 0
    serve(config, ns.host, ns.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
