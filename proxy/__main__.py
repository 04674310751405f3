"""The command line: ``ctxproxy`` (also ``python -m proxy``).

``ctxproxy serve --config PATH`` (the default command), ``check`` (validate a
config: every problem, each named by its path), ``schema`` (the config's JSON
Schema), ``sessions list|show|delete|export`` and ``replay`` (see
proxy/ops/cli.py).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import sys
from collections.abc import Sequence

from proxy.config.loader import describe, load_config
from proxy.config.model import Config
from proxy.config.schema import config_schema
from proxy.errors import ConfigError

COMMANDS = ("serve", "check", "schema", "sessions", "replay")


def _parser() -> argparse.ArgumentParser:
    from proxy.ops import cli

    parser = argparse.ArgumentParser(
        prog="ctxproxy",
        description="An OpenAI-compatible proxy that manages conversation context.",
        epilog="`ctxproxy COMMAND --help` describes a command; "
        "`ctxproxy --config PATH` is `ctxproxy serve --config PATH`.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    serve_p = sub.add_parser("serve", help="start the proxy (the default command)")
    serve_p.add_argument("--config", required=True, help="path to the YAML config")
    serve_p.add_argument("--host", help="override server.host")
    serve_p.add_argument("--port", type=int, help="override server.port")
    check_p = sub.add_parser("check", help="validate a config file: every problem, then exit")
    check_p.add_argument("--config", required=True, help="path to the YAML config")
    schema_p = sub.add_parser("schema", help="print the config file's JSON Schema")
    schema_p.add_argument("-o", "--output", help="file to write (default: stdout)")
    cli.add_commands(sub)
    return parser


def schema_text() -> str:
    """The JSON Schema as committed in config.schema.json."""
    return json.dumps(config_schema(), indent=2) + "\n"


def _load(path: str) -> Config | None:
    try:
        return load_config(path)
    except ConfigError as exc:
        print(describe(exc, path), file=sys.stderr)
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
    if args and args[0].startswith("-") and args[0] not in ("-h", "--help"):
        args.insert(0, "serve")
    if not args:
        _parser().print_help(sys.stderr)
        return 2
    ns = _parser().parse_args(args)
    if ns.command in ("sessions", "replay"):
        from proxy.ops import cli

        return cli.run(ns)
    if ns.command == "schema":
        if ns.output:
            with open(ns.output, "w") as f:
                f.write(schema_text())
        else:
            sys.stdout.write(schema_text())
        return 0
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


def console() -> None:
    """The ``ctxproxy`` console script."""
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
