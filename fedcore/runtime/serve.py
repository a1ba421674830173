"""Serving a role as ``fedcore serve`` asks: its flags checked, its options built, its process.

The command line hands a role its flags as plain values (:class:`LinkFlags`,
:class:`NodeFlags`, :class:`ExecFlags`); each checks them together when made (a
certificate without its key, an exec for both a link and a node) and builds the role's
options from them, with the TLS contexts, limits and launch settings the roles and
drivers take. :func:`serve` then sets up the process a role runs in (files private to
its user, no memory dumps) and serves it until Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import logging
import os
import signal
import ssl
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import fedcore.defaults as defaults
from fedcore.apps.environment import check_passed
from fedcore.apps.run_config import resolve_run_config
from fedcore.errors import FedcoreError, UsageError, first_error
from fedcore.event_loop import run_until_ended
from fedcore.non_dumpable import make_non_dumpable
from fedcore.roles.exec.app_user import AppUser, same_user_warning
from fedcore.roles.exec.launcher import LaunchSettings
from fedcore.runtime import exec as exec_runtime
from fedcore.runtime import link as link_runtime
from fedcore.runtime import node as node_runtime
from fedcore.runtime.addresses import Address, parse_address
from fedcore.runtime.tls import client_context, server_context
from fedcore.transport.grpc.guard import FleetLimits
from fedcore.transport.http.guard import HttpLimits

PRIVATE_UMASK = 0o077
"""Every file and directory a role creates is its user's only: 0600 and 0700. Set for
the whole process (SQLite makes the database, its WAL and shared-memory file under
it) and inherited by the app processes it starts."""

log = logging.getLogger("fedcore.serve")


@dataclass(frozen=True, kw_only=True)
class _Flags:
    """What every role takes."""

    work_dir: Path | None = None
    insecure: bool = False
    heartbeat_interval: float = defaults.HEARTBEAT_INTERVAL
    max_value_bytes: int = defaults.MAX_VALUE_LEN
    app_env: tuple[str, ...] = ()
    app_user: str | None = None
    ready_file: Path | None = None

    what: ClassVar[str]
    """The role, as the log line of an ending signal names it."""

    def _check(self) -> None:
        """Refuse an ``--app-env`` name or ``--app-user`` this process cannot honour."""
        check_passed(self.app_env)
        self._app_user()

    def _app_user(self) -> AppUser | None:
        return AppUser.named(self.app_user) if self.app_user is not None else None


@dataclass(frozen=True, kw_only=True)
class _LaunchFlags(_Flags):
    """What a role that launches ServerApps takes: a link, or an exec of a link."""

    claim_lease: float = defaults.CLAIM_LEASE
    max_runs: int = defaults.MAX_RUNS
    max_restarts: int = defaults.MAX_RESTARTS

    def _launch(self, *, leave_apps_running: bool) -> LaunchSettings:
        return LaunchSettings(
            claim_lease=self.claim_lease,
            max_runs=self.max_runs,
            max_restarts=self.max_restarts,
            app_heartbeat=self.heartbeat_interval,
            app_env=check_passed(self.app_env),
            app_user=self._app_user(),
            max_value_len=self.max_value_bytes,
            leave_apps_running=leave_apps_running,
        )


@dataclass(frozen=True, kw_only=True)
class LinkFlags(_LaunchFlags):
    """``fedcore serve --role link``'s flags."""

    what = "the link"

    fleet_address: str = defaults.FLEET_ADDRESS
    control_address: str = defaults.CONTROL_ADDRESS
    runtime_address: str | None = None
    exec_address: str | None = None
    exec_secret_file: Path | None = None
    no_local_exec: bool = False
    database: str = defaults.DATABASE
    control_token_file: Path | None = None
    control_ssl_certfile: Path | None = None
    control_ssl_keyfile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_ca_certfile: Path | None = None
    heartbeat_patience: float = defaults.HEARTBEAT_PATIENCE
    max_heartbeat_interval: float = defaults.MAX_HEARTBEAT_INTERVAL
    retire_nodes_after: float = defaults.RETIRE_NODES_AFTER
    authorized_nodes: Path | None = None
    fleet_idle_timeout: float = defaults.FLEET_IDLE_TIMEOUT
    fleet_body_timeout: float = defaults.FLEET_BODY_TIMEOUT
    fleet_connections_per_peer: int = defaults.FLEET_CONNECTIONS_PER_PEER
    fleet_max_connections: int = defaults.FLEET_MAX_CONNECTIONS
    fleet_requests_per_second: float = defaults.FLEET_REQUESTS_PER_SECOND
    fleet_requests_per_second_per_key: float = defaults.FLEET_REQUESTS_PER_SECOND_PER_KEY
    fleet_registrations_per_second: float = defaults.FLEET_REGISTRATIONS_PER_SECOND
    fleet_registration_burst: int = defaults.FLEET_REGISTRATION_BURST
    fleet_registrations_per_second_total: float = defaults.FLEET_REGISTRATIONS_PER_SECOND_TOTAL
    http_header_timeout: float = defaults.HTTP_HEADER_TIMEOUT
    http_body_timeout: float = defaults.HTTP_BODY_TIMEOUT
    http_idle_timeout: float = defaults.HTTP_IDLE_TIMEOUT
    http_connections_per_peer: int = defaults.HTTP_CONNECTIONS_PER_PEER
    http_max_connections: int = defaults.HTTP_MAX_CONNECTIONS

    def __post_init__(self) -> None:
        self._check()
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise UsageError("--ssl-certfile and --ssl-keyfile go together")
        if (self.control_ssl_certfile is None) != (self.control_ssl_keyfile is None):
            raise UsageError("--control-ssl-certfile and --control-ssl-keyfile go together")

    def options(self) -> link_runtime.LinkOptions:
        """The link's options; :class:`UsageError` for what only they can check."""
        tls = exec_tls = control_tls = None
        if self.ssl_certfile is not None and self.ssl_keyfile is not None:
            tls = server_context(
                self.ssl_certfile, self.ssl_keyfile, self.ssl_ca_certfile, alpn=["h2"]
            )
            exec_tls = server_context(self.ssl_certfile, self.ssl_keyfile, alpn=["http/1.1"])
        if self.control_ssl_certfile is not None and self.control_ssl_keyfile is not None:
            control_tls = server_context(
                self.control_ssl_certfile, self.control_ssl_keyfile, alpn=["http/1.1"]
            )
        options = link_runtime.LinkOptions(
            fleet_address=parse_address(self.fleet_address, what="--fleet-address"),
            control_address=parse_address(self.control_address, what="--control-address"),
            runtime_address=parse_address(
                self.runtime_address or defaults.RUNTIME_ADDRESS, what="--runtime-address"
            ),
            database=self.database,
            work_dir=self.work_dir or Path(".fedcore-link"),
            ready_file=self.ready_file,
            fleet_ssl=tls,
            insecure=self.insecure,
            # A link stopped here (Ctrl-C, SIGTERM) is one an operator restarts: its runs
            # in progress wait for it, as they do after a kill, rather than fail.
            launch=self._launch(leave_apps_running=True),
            exec_address=parse_address(self.exec_address, what="--exec-address")
            if self.exec_address
            else None,
            exec_secret_file=self.exec_secret_file,
            exec_ssl=exec_tls,
            control_ssl=control_tls,
            control_token_file=self.control_token_file,
            local_exec=not self.no_local_exec,
            heartbeat_patience=self.heartbeat_patience,
            max_heartbeat_interval=self.max_heartbeat_interval,
            retire_nodes_after=self.retire_nodes_after or None,
            max_value_len=self.max_value_bytes,
            authorized_nodes=self.authorized_nodes,
            fleet_limits=self._fleet_limits(),
            http_limits=HttpLimits(
                header_timeout=self.http_header_timeout,
                body_timeout=self.http_body_timeout,
                idle_timeout=self.http_idle_timeout,
                connections_per_peer=self.http_connections_per_peer,
                max_connections=self.http_max_connections,
            ),
        )
        options.check()
        return options

    def _fleet_limits(self) -> FleetLimits:
        return FleetLimits(
            idle_timeout=self.fleet_idle_timeout,
            body_timeout=self.fleet_body_timeout,
            connections_per_peer=self.fleet_connections_per_peer,
            max_connections=self.fleet_max_connections,
            requests_per_second=self.fleet_requests_per_second,
            request_burst=max(1, round(2 * self.fleet_requests_per_second)),
            requests_per_second_per_key=self.fleet_requests_per_second_per_key,
            request_burst_per_key=max(1, round(2 * self.fleet_requests_per_second_per_key)),
            registrations_per_second=self.fleet_registrations_per_second,
            registration_burst=self.fleet_registration_burst,
            registrations_per_second_total=self.fleet_registrations_per_second_total,
            registration_burst_total=2 * self.fleet_registration_burst,
        )

    def start(self) -> Callable[[], Awaitable[None]]:
        """The link, ready to serve: its options built, its warning given, its spool made."""
        options = self.options()
        if options.local_exec and options.launch.app_user is None:
            stored = [] if self.database == ":memory:" else [f"the link's database {self.database}"]
            _warn_same_user(
                "ServerApp",
                [
                    *stored,
                    f"its work directory {options.work_dir} (the control token, the exec "
                    "secret, every run's bundle and output)",
                ],
                "Give --app-user USER (the link running as root), or --no-local-exec and "
                "execs of their own user.",
            )
        _spool_in(options.work_dir / "spool")
        return lambda: link_runtime.serve_link(options)


@dataclass(frozen=True, kw_only=True)
class NodeFlags(_Flags):
    """``fedcore serve --role node``'s flags."""

    what = "the node"

    link: str | None = None
    node_config: str = ""
    exec_socket: Path | None = None
    exec_secret_file: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    root_certificates: Path | None = None
    max_concurrent: int = defaults.MAX_CONCURRENT
    num_cpus: float | None = None
    auth_key: Path | None = None

    def __post_init__(self) -> None:
        _check_app_user(self.app_user, self.exec_socket)
        self._check()
        if self.link is None:
            raise UsageError("--role node needs --link HOST:PORT (the link's fleet address)")
        _check_link_tls(
            parse_address(self.link, what="--link"),
            self.root_certificates,
            self.insecure,
            client=(self.ssl_certfile, self.ssl_keyfile),
        )
        if self.exec_socket is not None and self.exec_secret_file is None:
            raise UsageError("--exec-socket needs --exec-secret-file (the exec's secret)")

    def options(self) -> node_runtime.NodeOptions:
        """The node's options."""
        assert self.link is not None
        link = parse_address(self.link, what="--link")
        passed = check_passed(self.app_env)
        user = self._app_user()
        return node_runtime.NodeOptions(
            link=link,
            node_config=resolve_run_config(None, self.node_config) if self.node_config else {},
            work_dir=self.work_dir or Path(".fedcore-node"),
            heartbeat_interval=self.heartbeat_interval,
            max_concurrent=self.max_concurrent,
            num_cpus=self.num_cpus,
            ssl=_link_tls(
                link,
                self.root_certificates,
                alpn=["h2"],
                client=(self.ssl_certfile, self.ssl_keyfile),
            ),
            ready_file=self.ready_file,
            exec_socket=self.exec_socket,
            exec_secret_file=self.exec_secret_file,
            auth_key=self.auth_key,
            app_env=passed,
            max_value_len=self.max_value_bytes,
            app_user=user,
        )

    def start(self) -> Callable[[], Awaitable[None]]:
        """The node, ready to serve."""
        options = self.options()
        return lambda: node_runtime.serve_node(options)


@dataclass(frozen=True, kw_only=True)
class ExecFlags(_LaunchFlags):
    """``fedcore serve --role exec``'s flags: an exec of a link's runs (``link_exec``), or
    of a node's ClientApps (``exec_socket``)."""

    what = "the exec"

    link_exec: str | None = None
    exec_socket: Path | None = None
    exec_secret_file: Path | None = None
    runtime_address: str | None = None
    root_certificates: Path | None = None

    def __post_init__(self) -> None:
        _check_app_user(self.app_user, self.exec_socket)
        self._check()
        if self.exec_socket is not None:
            if self.link_exec is not None or self.exec_secret_file is None:
                raise UsageError(
                    "an exec serves a link (--link-exec) or a node (--exec-socket), not both; "
                    "either way it needs --exec-secret-file"
                )
            return
        if self.link_exec is None or self.exec_secret_file is None:
            raise UsageError(
                "--role exec needs --link-exec HOST:PORT (the link's exec API) and "
                "--exec-secret-file PATH (the secret it shares with the link)"
            )
        link = parse_address(self.link_exec, what="--link-exec")
        if self.runtime_address is not None:
            parse_address(self.runtime_address, what="--runtime-address")
        _check_link_tls(link, self.root_certificates, self.insecure)

    def options(self) -> exec_runtime.ExecOptions:
        """The options of an exec of a link (one with ``link_exec``)."""
        assert self.link_exec is not None
        assert self.exec_secret_file is not None
        link = parse_address(self.link_exec, what="--link-exec")
        return exec_runtime.ExecOptions(
            link=link,
            secret_file=self.exec_secret_file,
            runtime_address=self.runtime_address,
            work_dir=self.work_dir or Path(".fedcore-exec"),
            ready_file=self.ready_file,
            ssl=_link_tls(link, self.root_certificates),
            launch=self._launch(leave_apps_running=False),
        )

    def start(self) -> Callable[[], Awaitable[None]]:
        """The exec, ready to serve."""
        secret = self.exec_secret_file
        assert secret is not None
        if self.exec_socket is not None:
            socket, passed = self.exec_socket, check_passed(self.app_env)
            _warn_same_user(
                "ClientApp",
                [f"the exec secret {secret}", "every file this user can"],
                "Run this exec as a user of its own, not the node's (the node's key is then "
                "out of reach).",
            )
            return lambda: exec_runtime.serve_node_exec(
                socket, secret, self.ready_file, app_env=passed
            )
        options = self.options()
        if options.launch.app_user is None:
            _warn_same_user(
                "ServerApp",
                [
                    f"the exec secret {secret} (and with it the link's exec API: claim runs, "
                    "with their bundles and launch secrets)",
                    f"its work directory {options.work_dir} (every run's output)",
                ],
                "Give --app-user USER (the exec running as root).",
            )
        return lambda: exec_runtime.serve_exec(options)


RoleFlags = LinkFlags | NodeFlags | ExecFlags


def serve(flags: RoleFlags) -> None:
    """Serve the role ``flags`` are for until it returns or Ctrl-C or SIGTERM stops it.

    A stopped role ends well (status 0); SIGHUP is left to the role (the link reloads
    its authorized nodes on it).
    """
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    make_non_dumpable()
    os.umask(PRIVATE_UMASK)
    role = flags.start()
    try:
        run_until_ended(
            role, flags.what, signals=(signal.SIGINT, signal.SIGTERM), end_as_received=False
        )
    except ExceptionGroup as group:
        # A role that cannot start (a secret refused, a file unreadable) says why in one
        # line, as any other error a person can fix; anything else keeps its traceback.
        errors, _ = group.split(FedcoreError)
        if errors is None:
            raise
        raise first_error(errors) from None


def _check_app_user(app_user: str | None, exec_socket: Path | None) -> None:
    if app_user is not None and exec_socket is not None:
        raise UsageError(
            "--app-user is for a link, an exec of a link, or a node starting its ClientApps "
            "itself: a node's exec (--exec-socket) starts them as its own user"
        )


def _check_link_tls(
    link: Address,
    root_certificates: Path | None,
    insecure: bool,
    client: tuple[Path | None, Path | None] = (None, None),
) -> None:
    """Refuse what TLS to the link cannot be: plaintext off loopback unless ``insecure``, a
    client certificate without its key or without TLS."""
    certfile, keyfile = client
    if (certfile is None) != (keyfile is None):
        raise UsageError("--ssl-certfile and --ssl-keyfile go together")
    if certfile is not None and root_certificates is None:
        raise UsageError("a client certificate needs --root-certificates (TLS to the link)")
    if root_certificates is None and not insecure and not link.is_loopback:
        raise UsageError(
            "connecting to a link on another machine needs TLS: give --root-certificates, "
            "or --insecure to accept plaintext"
        )


def _link_tls(
    link: Address,
    root_certificates: Path | None,
    alpn: list[str] | None = None,
    client: tuple[Path | None, Path | None] = (None, None),
) -> ssl.SSLContext | None:
    """TLS to the link, trusting ``root_certificates`` (checked by :func:`_check_link_tls`);
    ``client`` is the certificate and key to present, for a link that asks for one."""
    if root_certificates is None:
        return None
    certfile, keyfile = client
    return client_context(root_certificates, certfile, keyfile, alpn=alpn)


def _warn_same_user(apps: str, reachable: list[str], remedy: str) -> None:
    """Say once, at start, what the app processes of a role running as its user can reach."""
    log.warning(same_user_warning(apps, reachable, remedy))


def _spool_in(directory: Path) -> None:
    """Have this process spool large payloads (:mod:`fedcore.wire.spool`) in ``directory``.

    The link relays models in temporary files: in its work directory they are on the
    disk the operator chose for it, rather than in a ``/tmp`` that may be a memory
    file system. The files have no names, so nothing is left there after a crash.
    """
    directory.mkdir(parents=True, exist_ok=True)
    tempfile.tempdir = str(directory)
