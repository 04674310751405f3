"""Command line: `python -m proxy [serve] --config PATH`, `python -m proxy check --config PATH`.

Also `python -m proxy sessions list|show|delete|export ...` and
`python -m proxy replay FILE --config PATH --policy NAME` (see proxy/ops/cli.py).
"""

from __future__ import annotations

import argparse
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
            p.add_argument(
                "--drain-s",
                type=float,
                default=2.0,
                help="on SIGTERM, answer /readyz 503 this long before stopping (default 2)",
            )
    return parser


def _load(path: str) -> Config | None:
    try:
        return load_config(path)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return None


def serve(config: Config, host: str | None, port: int | None, drain_s: float) -> int:
    from proxy.ops.server import serve as run
    from proxy.telemetry.logging import configure_logging

    configure_logging(config.logging.level, config.logging.format)
    try:
        return run(config, host, port, drain_s=drain_s)
    except KeyboardInterrupt:  # Ctrl-C: uvicorn re-raises it after its graceful stop
        return 130


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
    return serve(config, ns.host, ns.port, ns.drain_s)


if __name__ == "__main__":
    sys.exit(main())
