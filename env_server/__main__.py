"""`python -m env_server`: run the tito environment server."""

from __future__ import annotations

import argparse
import asyncio
import sys

from env_server.config import ConfigError, load_config
from env_server.logging_setup import setup_logging


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m env_server",
        description="tito environment server: runs tool calls in hardened sandboxes (Docker or bubblewrap) over gRPC.",
        epilog="Every setting can also come from a YAML file (--config) or TITO_* environment variables "
        "(nested: TITO_SANDBOX__MEM_LIMIT=1g). Flags win over variables, variables over the file.",
    )
    parser.add_argument("--config", help="YAML config file (also TITO_CONFIG)")
    parser.add_argument("--host", help="listen address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="gRPC port (default 50051)")
    parser.add_argument("--metrics-port", type=int, help="Prometheus port (default 9464, 0 disables)")
    parser.add_argument("--server-name", help="labels this server's containers (default 'default')")
    parser.add_argument("--pool-size", type=int, help="warm sandboxes kept ready")
    parser.add_argument("--environment", action="append", dest="environments", metavar="MODULE:CLASS",
                        help="load an extra environment class (repeatable)")
    parser.add_argument("--tls-cert-file", metavar="PEM", help="server certificate: serve TLS (with --tls-key-file)")
    parser.add_argument("--tls-key-file", metavar="PEM", help="private key of --tls-cert-file")
    parser.add_argument("--tls-client-ca-file", metavar="PEM", help="require client certificates from this CA (mTLS)")
    parser.add_argument("--auth-tokens-file", metavar="FILE", help="require a bearer token from this file (one a line)")
    parser.add_argument("--health-port", type=int, help="also serve plaintext grpc.health.v1 alone on this port")
    parser.add_argument("--allow-insecure", action="store_true", default=None,
                        help="listen on a non-loopback host without TLS and auth (only behind another guard)")
    parser.add_argument("--sweep", action="store_true",
                        help="remove the sandboxes (containers and socket folders, or bwrap process trees and cgroups) that servers of this --server-name "
                        "left behind (e.g. after a SIGKILL), then exit without serving")
    parser.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    parser.add_argument("--log-format", choices=["text", "json"])
    args = parser.parse_args(argv)

    overrides = {
        "host": args.host,
        "port": args.port,
        "metrics_port": args.metrics_port,
        "server_name": args.server_name,
        "environments": args.environments,
        "log_level": args.log_level,
        "log_format": args.log_format,
        # Merged into the pool settings from the file and environment, and validated like them.
        "pool": {"target_size": args.pool_size} if args.pool_size is not None else None,
        "tls": _given(cert_file=args.tls_cert_file, key_file=args.tls_key_file, client_ca_file=args.tls_client_ca_file),
        "auth": _given(tokens_file=args.auth_tokens_file),
        "health_port": args.health_port,
        "allow_insecure": args.allow_insecure,
    }
    try:
        config = load_config(args.config, **overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    setup_logging(config.log_level, config.log_format)
    if args.sweep:
        return sweep(config)

    from env_server.environments.loader import EnvironmentLoadError
    from env_server.server import EnvServer

    try:
        server = EnvServer(config)
    except (EnvironmentLoadError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        run_event_loop(server.serve_forever(), config.event_loop)
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def _given(**values: str | None) -> dict[str, str] | None:
    """The flags of one nested section that were given (None when none was)."""
    given = {k: v for k, v in values.items() if v is not None}
    return given or None


def sweep(config) -> int:
    """`--sweep`: what a killed server of this name left, removed without starting a server."""
    from env_server.sandbox.backends import make_sandbox_backend

    backend = make_sandbox_backend(config.sandbox, server_name=config.server_name, instance_id="sweep")
    try:
        removed = backend.sweep()
    except Exception as e:  # noqa: BLE001 - said in one line, like every start-up error
        print(f"error: cannot sweep the {backend.name} sandboxes of server {config.server_name!r}: {e}", file=sys.stderr)
        return 1
    finally:
        backend.close()
    print(f"removed {removed} sandbox(es) of server {config.server_name!r} ({backend.name} backend)")
    return 0


def run_event_loop(main, choice: str) -> None:
    if choice in ("auto", "uvloop"):
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise SystemExit("error: event_loop=uvloop but uvloop is not installed (pip install uvloop)")
        else:
            uvloop.run(main)
            return
    asyncio.run(main)


if __name__ == "__main__":
    sys.exit(main())
