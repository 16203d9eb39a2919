"""``edgeagent run``: start the daemon (what the systemd unit and the README's one command run)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from pathlib import Path

from edgeagent import aio
from edgeagent.commands.helpfmt import DefaultsFormatter
from edgeagent.config import Config, config_file, load_config
from edgeagent.hardware.profile import ProfileError
from edgeagent.models.package import PackageError
from edgeagent.sections import ConfigError

EXIT_CONFIG = 2  # bad config or command line: fix it and start again
EXIT_STARTUP = 1  # could not start (listener in use, no permission)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run",
        formatter_class=DefaultsFormatter,
        help="run the agent daemon (serves models over HTTP on a Unix socket and TCP)",
        description=(
            "Run the agent until SIGTERM or Ctrl-C: detect the board, load every model package "
            "in the models directory, serve the Open Inference Protocol (KServe v2) and "
            "/v1/classify on a Unix socket and on http://127.0.0.1:8080. Without --config it "
            "reads /etc/edgeagent/agent.toml when present, else runs on built-in defaults. "
            "On SIGTERM it stops accepting, finishes in-flight requests "
            "([server] drain_timeout_s) and exits 0. Exit status 2: invalid config or flags; "
            "1: could not start (e.g. the port is in use)."
        ),
    )
    parser.add_argument(
        "--config", type=Path, metavar="FILE", help="agent.toml (default /etc/edgeagent/agent.toml)"
    )
    parser.add_argument(
        "--models-dir",
        type=Path,
        metavar="DIR",
        help=(
            "serve every model package in DIR ([agent] models_dir; default "
            "$EDGEAGENT_MODELS_DIR, else ./zoo, else <state dir>/models)"
        ),
    )
    parser.add_argument(
        "--socket",
        type=Path,
        metavar="PATH",
        help="Unix socket to listen on ([server] unix_socket)",
    )
    parser.add_argument(
        "--port",
        type=int,
        metavar="N",
        help="TCP port on [server] tcp_host, 0 to disable TCP ([server] tcp_port)",
    )
    parser.set_defaults(handler=run)


def apply_flags(config: Config, args: argparse.Namespace) -> Config:
    """Command-line flags override the file; the result is validated like the file."""
    agent, server = config.agent, config.server
    if args.models_dir is not None:
        agent = dataclasses.replace(agent, models_dir=args.models_dir)
    if args.socket is not None:
        server = dataclasses.replace(server, unix_socket=args.socket)
    if args.port is not None:
        server = dataclasses.replace(server, tcp_port=args.port)
    server.validate()
    return dataclasses.replace(config, agent=agent, server=server)


def run(args: argparse.Namespace) -> int:
    from edgeagent.daemon import Daemon, StartupError

    try:
        config = apply_flags(load_config(args.config), args)
    except ConfigError as exc:
        print(f"edgeagent run: invalid configuration: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    logging.getLogger().setLevel(logging.DEBUG if args.verbose else config.agent.log_level)

    def announce(daemon: Daemon) -> None:
        rows = daemon.registry.index()
        ready = [f"{r['name']} {r['version']}" for r in rows if r["state"] == "READY"]
        print(f"edgeagent serving {', '.join(ready) or 'no models'}", flush=True)
        for row in rows:
            if row["state"] != "READY":
                print(f"  {row['name']} is {row['state']}: {row['reason']}", flush=True)
        for where in daemon.listening:
            print(f"  listening on {where}", flush=True)

    try:
        daemon = Daemon(
            config,
            reread=lambda: apply_flags(load_config(args.config), args),
            config_file=config_file(args.config),
        )
        aio.run(daemon.serve(on_ready=announce), config.server.event_loop)
    except (ConfigError, PackageError, ProfileError) as exc:
        print(f"edgeagent run: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except StartupError as exc:
        print(f"edgeagent run: cannot start: {exc}", file=sys.stderr)
        return EXIT_STARTUP
    except OSError as exc:  # state directory not writable, socket directory not creatable …
        where = f" {exc.filename}" if exc.filename else ""
        print(f"edgeagent run: cannot start:{where} {exc.strerror or exc}", file=sys.stderr)
        return EXIT_STARTUP
    return 0
