"""``fedcore serve --role link|node|exec``: run a long-lived role until Ctrl-C or SIGTERM."""

from __future__ import annotations

import logging
import os
import signal
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    import ssl

    from fedcore.roles.exec.launcher import LaunchSettings
    from fedcore.runtime.addresses import Address

# The runtime is imported by the role that runs, not here: `fedcore serve --help`
# needs none of it. So the defaults the help shows are written out; a test checks each
# against its home (tests/cli/test_written_out_defaults.py).
CLAIM_LEASE = 10.0
"""``LaunchSettings.claim_lease``."""
MAX_RUNS = 8
"""``LaunchSettings.max_runs``."""
MAX_RESTARTS = 1
"""``LaunchSettings.max_restarts``."""
RUNTIME_ADDRESS = "127.0.0.1:0"
"""``fedcore.runtime.link.RUNTIME_ADDRESS``."""
HEARTBEAT_PATIENCE = 3.0
"""``fedcore.state.base.DEFAULT_HEARTBEAT_PATIENCE``."""
FLEET_IDLE_TIMEOUT = 300.0
"""``fedcore.transport.grpc.guard.FleetLimits.idle_timeout``, and so on below."""
FLEET_BODY_TIMEOUT = 60.0
FLEET_CONNECTIONS_PER_PEER = 2048
FLEET_MAX_CONNECTIONS = 8192
FLEET_REQUESTS_PER_SECOND = 2000.0
FLEET_REQUESTS_PER_SECOND_PER_KEY = 100.0
FLEET_REGISTRATIONS_PER_SECOND = 10.0
FLEET_REGISTRATION_BURST = 1000
FLEET_REGISTRATIONS_PER_SECOND_TOTAL = 100.0
MAX_HEARTBEAT_INTERVAL = 300.0
"""``fedcore.roles.link.fleet.MAX_HEARTBEAT_INTERVAL``."""
RETIRE_NODES_AFTER = 86_400.0
"""``fedcore.roles.link.retirement.RETIRE_NODES_AFTER``."""
HTTP_HEADER_TIMEOUT = 20.0
"""``fedcore.transport.http.guard.HttpLimits.header_timeout``, and so on below."""
HTTP_BODY_TIMEOUT = 120.0
HTTP_IDLE_TIMEOUT = 75.0
HTTP_CONNECTIONS_PER_PEER = 1024
HTTP_MAX_CONNECTIONS = 4096
MAX_VALUE_LEN = 512 * 1024 * 1024
"""``fedcore.wire.MAX_VALUE_LEN``: Flower's cap on a message."""
HEARTBEAT_INTERVAL = 5.0
"""Seconds between heartbeats, of nodes and of ServerApps (``LaunchSettings.app_heartbeat``):
with the default patience a dead node is found within 16 s, and one late beat on a
loaded machine is no alarm."""

ROLES = ("link", "node", "exec")
PRIVATE_UMASK = 0o077
"""Every file and directory a role creates is its user's only: 0600 and 0700. Set for
the whole process (SQLite makes the database, its WAL and shared-memory file under
it) and inherited by the app processes it starts."""


@click.command()
@click.option("--role", type=click.Choice(ROLES), required=True, help="Which role to serve.")
@click.option(
    "--fleet-address",
    default="0.0.0.0:9092",
    show_default=True,
    help="[link] Where nodes connect (gRPC). Port 0 picks a free port.",
)
@click.option(
    "--control-address",
    default="127.0.0.1:9093",
    show_default=True,
    help="[link] Where `fedcore run/ls/log/stop` connect (HTTP; HTTPS with "
    "--control-ssl-certfile). Every request but GET /v1/health needs the control token. "
    "Off loopback it needs TLS, or --insecure.",
)
@click.option(
    "--runtime-address",
    help=f"[link] Where ServerApp processes connect (HTTP); loopback, as they run on this "
    f"machine (default: {RUNTIME_ADDRESS}). Port 0 picks a free port the first time and the "
    "same one on a restart (kept in the work dir's runtime.port), so the ServerApps of runs "
    "in progress reach the restarted link. [exec] Where the ServerApps it launches "
    "reach the link's runtime API (default: the address the link gives).",
)
@click.option(
    "--exec-address",
    help="[link] Also serve the exec API here (HTTP, every request signed with the shared "
    "secret), for execs started with `fedcore serve --role exec`. Port 0 picks a free port. "
    "Off loopback it uses TLS (--ssl-certfile/--ssl-keyfile).",
)
@click.option(
    "--exec-secret-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="[link, node, exec] The secret a link or node shares with its execs; made (random, "
    "mode 0600) if missing. Default for the link: exec.secret in its work directory; required "
    "for an exec, and for a node with --exec-socket.",
)
@click.option(
    "--no-local-exec",
    is_flag=True,
    help="[link] Launch no ServerApp in the link process: leave every run to external execs "
    "(needs --exec-address).",
)
@click.option("--link-exec", help="[exec] The link's exec API address, HOST:PORT.")
@click.option(
    "--exec-socket",
    type=click.Path(dir_okay=False, path_type=Path),
    help="[node, exec] The Unix socket of a node's exec. An exec given it listens there and "
    "starts the node's ClientApp processes (instead of --link-exec); a node given it has that "
    "exec start them, instead of starting them itself (process isolation).",
)
@click.option(
    "--claim-lease",
    type=click.FloatRange(min=0, min_open=True),
    default=CLAIM_LEASE,
    show_default=True,
    help="[link, exec] Seconds a claim on a run lasts unless renewed (every third of it); "
    "the run of an exec that dies before launching it goes back to pending after that.",
)
@click.option(
    "--max-runs",
    type=click.IntRange(min=1),
    default=MAX_RUNS,
    show_default=True,
    help="[link, exec] ServerApp processes launched at once.",
)
@click.option(
    "--max-restarts",
    type=click.IntRange(min=0),
    default=MAX_RESTARTS,
    show_default=True,
    help="[link, exec] Times a run's ServerApp process that crashed or was killed is "
    "started again before the run fails (0: it fails at once, and the ServerApp keeps "
    "no round checkpoints). The new process goes on from the last round finished, "
    "kept on the link; the nodes keep their contexts.",
)
@click.option(
    "--database",
    default="fedcore-link.db",
    show_default=True,
    help="[link] The SQLite file holding runs, nodes and messages across restarts; "
    "':memory:' keeps nothing.",
)
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Bundles, process output and (link) large models in transit (default: .fedcore-link, "
    ".fedcore-node or .fedcore-exec here).",
)
@click.option(
    "--insecure",
    is_flag=True,
    help="Accept plaintext on listeners other machines can reach (the control API's token "
    "then crosses the network in the clear).",
)
@click.option(
    "--control-token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="[link] Where the control API's bearer token is kept (created, random, mode 0600, "
    "if missing; default: control.token in the work directory). The control API always "
    "wants it; `fedcore run/ls/log/stop` send --token-file, $FEDCORE_CONTROL_TOKEN, or "
    ".fedcore-link/control.token when run where a link with the default work directory runs.",
)
@click.option(
    "--control-ssl-certfile",
    type=click.Path(dir_okay=False, path_type=Path),
    help="[link] TLS certificate for the control API (HTTPS); `fedcore run/ls/log/stop` "
    "verify it with --root-certificates.",
)
@click.option(
    "--control-ssl-keyfile",
    type=click.Path(dir_okay=False, path_type=Path),
    help="[link] The key of --control-ssl-certfile.",
)
@click.option(
    "--ssl-certfile",
    type=click.Path(dir_okay=False, path_type=Path),
    help="[link] TLS certificate (fleet and exec APIs). [node] Its client certificate, for a "
    "link started with --ssl-ca-certfile.",
)
@click.option(
    "--ssl-keyfile",
    type=click.Path(dir_okay=False, path_type=Path),
    help="[link, node] The key of --ssl-certfile.",
)
@click.option(
    "--ssl-ca-certfile",
    type=click.Path(dir_okay=False, path_type=Path),
    help="[link] CA for client certificates: nodes must present one it signed (mutual TLS, "
    "a node's --ssl-certfile/--ssl-keyfile).",
)
@click.option("--link", "link", help="[node] The link's fleet address, HOST:PORT.")
@click.option(
    "--node-config",
    default="",
    help='[node] This node\'s config: "partition-id=0 num-partitions=2".',
)
@click.option(
    "--root-certificates",
    type=click.Path(dir_okay=False, path_type=Path),
    help="[node, exec] CA certificates to verify the link with (TLS).",
)
@click.option(
    "--heartbeat-interval",
    type=click.FloatRange(min=0, min_open=True),
    default=HEARTBEAT_INTERVAL,
    show_default=True,
    help="[node] Seconds between this node's heartbeats (at most the link's "
    "--max-heartbeat-interval). [link, exec] Seconds between the "
    "heartbeats of the ServerApp processes it launches. The link declares a node offline, "
    "or a ServerApp silent, after --heartbeat-patience times that without one.",
)
@click.option(
    "--heartbeat-patience",
    type=click.FloatRange(min=1),
    default=HEARTBEAT_PATIENCE,
    show_default=True,
    help="[link] How many heartbeat intervals a node or a ServerApp may stay silent. A "
    "ServerApp whose exec still holds its running process is never failed for silence; one "
    "that exits fails its run at once. Stalls of the link's own event loop do not count.",
)
@click.option(
    "--max-heartbeat-interval",
    type=click.FloatRange(min=0, min_open=True),
    default=MAX_HEARTBEAT_INTERVAL,
    show_default=True,
    help="[link] The longest heartbeat interval a node may declare. A node declaring more is "
    "refused (INVALID_ARGUMENT, naming this bound) at registration and at each heartbeat, "
    "so that every node that stops beating is offline within --heartbeat-patience times this.",
)
@click.option(
    "--retire-nodes-after",
    type=click.FloatRange(min=0),
    default=RETIRE_NODES_AFTER,
    show_default=True,
    metavar="SECONDS",
    help="[link] Delete a node offline this long, from memory and the database (0: never). "
    "Under trust on first use any key registers: this is how long the registrations nobody "
    "uses again are kept. A node that comes back later registers again, as a new node.",
)
@click.option(
    "--max-concurrent",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="[node] Messages handled at once.",
)
@click.option(
    "--num-cpus",
    type=click.FloatRange(min=0, min_open=True),
    help="[node] CPUs each ClientApp process may use: OMP_NUM_THREADS, MKL_NUM_THREADS and "
    "OPENBLAS_NUM_THREADS (so BLAS, OpenMP and torch) are set to this, rounded up, in its "
    "environment; one already set is kept (default: this machine's CPUs ÷ --max-concurrent).",
)
@click.option(
    "--auth-key",
    type=click.Path(dir_okay=False, path_type=Path),
    help="[node] The node's signing key (PEM; Ed25519, ECDSA P-256 or P-384, as `fedcore "
    "keygen` writes): the link knows the node by it, and every fleet request is signed with "
    "it (default: node.key in --work-dir, made on first start, mode 0600).",
)
@click.option(
    "--authorized-nodes",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="[link] Admit only the nodes whose public keys this file lists, one per line "
    "(OpenSSH or PEM form; # comments). Without it any key may register: a node is "
    "known by the first key it registers with (trust on first use).",
)
@click.option(
    "--fleet-idle-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=FLEET_IDLE_TIMEOUT,
    show_default=True,
    help="[link] Seconds a fleet connection with no call in progress may stay silent before "
    "the link closes it (idle and half-open sockets; TCP keepalive finds dead peers mid-call).",
)
@click.option(
    "--fleet-body-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=FLEET_BODY_TIMEOUT,
    show_default=True,
    help="[link] Seconds one request frame may take to arrive once its call began; a stalled "
    "call ends INVALID_ARGUMENT.",
)
@click.option(
    "--fleet-connections-per-peer",
    type=click.IntRange(min=1),
    default=FLEET_CONNECTIONS_PER_PEER,
    show_default=True,
    help="[link] Fleet connections one IP address may hold open (nodes behind one NAT share "
    "an address); more are closed on arrival.",
)
@click.option(
    "--fleet-max-connections",
    type=click.IntRange(min=1),
    default=FLEET_MAX_CONNECTIONS,
    show_default=True,
    help="[link] Fleet connections at once (and the connections of all the link's APIs "
    "together, 64 under the open-file limit). At a cap a new connection closes the one idle "
    "the longest (or is refused if none is idle).",
)
@click.option(
    "--fleet-requests-per-second",
    type=click.FloatRange(min=0, min_open=True),
    default=FLEET_REQUESTS_PER_SECOND,
    show_default=True,
    help="[link] Fleet calls one IP address may start per second on average (bursts of twice "
    "that); more end RESOURCE_EXHAUSTED with a hint of how long to wait (nodes back off and "
    "retry), and the link logs the flood once a minute.",
)
@click.option(
    "--fleet-requests-per-second-per-key",
    type=click.FloatRange(min=0, min_open=True),
    default=FLEET_REQUESTS_PER_SECOND_PER_KEY,
    show_default=True,
    help="[link] Fleet calls one node key may make per second on average (bursts of twice "
    "that), from any address, once its signature is checked; more end RESOURCE_EXHAUSTED.",
)
@click.option(
    "--fleet-registrations-per-second",
    type=click.FloatRange(min=0, min_open=True),
    default=FLEET_REGISTRATIONS_PER_SECOND,
    show_default=True,
    help="[link] Node registrations one IP address may make per second on average, after a "
    "burst of --fleet-registration-burst; more end RESOURCE_EXHAUSTED (a node retries).",
)
@click.option(
    "--fleet-registration-burst",
    type=click.IntRange(min=1),
    default=FLEET_REGISTRATION_BURST,
    show_default=True,
    help="[link] Node registrations one IP address may make at once (a fleet behind one NAT "
    "starting together); the link in all, twice that.",
)
@click.option(
    "--fleet-registrations-per-second-total",
    type=click.FloatRange(min=0, min_open=True),
    default=FLEET_REGISTRATIONS_PER_SECOND_TOTAL,
    show_default=True,
    help="[link] Node registrations per second from all addresses together, on average.",
)
@click.option(
    "--http-header-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=HTTP_HEADER_TIMEOUT,
    show_default=True,
    help="[link] Seconds a request to the control, runtime or exec API may take to send its "
    "headers, from its first byte; a slower one (slowloris) has its connection closed.",
)
@click.option(
    "--http-body-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=HTTP_BODY_TIMEOUT,
    show_default=True,
    help="[link] Seconds a request to those APIs may take to send its body (a run's bundle, a "
    "ServerApp's model), from the end of its headers; then its connection is closed.",
)
@click.option(
    "--http-idle-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=HTTP_IDLE_TIMEOUT,
    show_default=True,
    help="[link] Seconds a connection to those APIs may stay silent between requests.",
)
@click.option(
    "--http-connections-per-peer",
    type=click.IntRange(min=1),
    default=HTTP_CONNECTIONS_PER_PEER,
    show_default=True,
    help="[link] Connections one IP address may hold open to each of those APIs; more are "
    "closed on arrival.",
)
@click.option(
    "--http-max-connections",
    type=click.IntRange(min=1),
    default=HTTP_MAX_CONNECTIONS,
    show_default=True,
    help="[link] Connections to each of those APIs at once (and to all the link's APIs "
    "together, 64 under the open-file limit). At a cap a new connection closes the one idle "
    "the longest (or is refused if none is idle).",
)
@click.option(
    "--max-value-bytes",
    type=click.IntRange(min=1),
    default=MAX_VALUE_LEN,
    metavar="BYTES",
    help="[link, node, exec] The most bytes one str or bytes value of a record may take (a "
    "model serialized into a ConfigRecord, say). A link refuses a longer one in what it "
    "decodes (nodes' replies, what its ServerApps push) and its ServerApps refuse to push "
    "one; a node refuses a longer one in the messages it pulls (an error reply) and its "
    "ClientApps' replies holding one become error replies (code 2). An exec gives it to the "
    "ServerApps it launches. Give a link, its execs and its nodes the same cap. Default: "
    f"{MAX_VALUE_LEN} (512 MiB, Flower's cap on a message).",
)
@click.option(
    "--app-env",
    "app_env",
    multiple=True,
    metavar="NAME",
    help="[link, node, exec] Pass this variable of the environment on to the app processes "
    "started here (repeatable). They get only PATH, HOME, LANG, LC_*, TMPDIR, TZ, PYTHONPATH, "
    "VIRTUAL_ENV, LD_LIBRARY_PATH, CUDA_*, the thread variables and the like (docs/security.md, "
    "Isolation): no secret of this process's. FEDCORE_* variables are never passed.",
)
@click.option(
    "--app-user",
    metavar="USER",
    help="[link, exec] Run the ServerApp processes launched here as USER; [node] its "
    "ClientApp processes (needs root; not root itself). Each gets a private copy of its app; "
    "USER must be able to run this Python. Without it app processes run as this role's user "
    "and can read its files: the link's database and control token, a node's key (a warning "
    "at start says which).",
)
@click.option(
    "--ready-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the bound addresses and pid here (JSON) once serving (for scripts and tests).",
)
def serve(
    role: str,
    fleet_address: str,
    control_address: str,
    runtime_address: str | None,
    exec_address: str | None,
    exec_secret_file: Path | None,
    no_local_exec: bool,
    link_exec: str | None,
    exec_socket: Path | None,
    claim_lease: float,
    max_runs: int,
    max_restarts: int,
    database: str,
    work_dir: Path | None,
    insecure: bool,
    control_token_file: Path | None,
    control_ssl_certfile: Path | None,
    control_ssl_keyfile: Path | None,
    ssl_certfile: Path | None,
    ssl_keyfile: Path | None,
    ssl_ca_certfile: Path | None,
    link: str | None,
    node_config: str,
    root_certificates: Path | None,
    heartbeat_interval: float,
    heartbeat_patience: float,
    max_heartbeat_interval: float,
    retire_nodes_after: float,
    max_concurrent: int,
    num_cpus: float | None,
    auth_key: Path | None,
    authorized_nodes: Path | None,
    fleet_idle_timeout: float,
    fleet_body_timeout: float,
    fleet_connections_per_peer: int,
    fleet_max_connections: int,
    fleet_requests_per_second: float,
    fleet_requests_per_second_per_key: float,
    fleet_registrations_per_second: float,
    fleet_registration_burst: int,
    fleet_registrations_per_second_total: float,
    http_header_timeout: float,
    http_body_timeout: float,
    http_idle_timeout: float,
    http_connections_per_peer: int,
    http_max_connections: int,
    max_value_bytes: int,
    app_env: tuple[str, ...],
    app_user: str | None,
    ready_file: Path | None,
) -> None:
    """Serve a role until interrupted.

    \b
    link: the hub. Nodes connect to its fleet API; `fedcore run` submits runs to its
          control API; it launches each run's ServerApp process (its exec role),
          unless --no-local-exec leaves that to external execs.
    node: one device or data silo. Connects out to the link, runs ClientApps in a
          process per run (its exec role; or its own exec's, --exec-socket), and
          needs no inbound port.
    exec: launches the ServerApps of a link's runs (--link-exec), or the ClientApps of
          a node (--exec-socket), in a process of its own (process isolation);
          needs --exec-secret-file.

    Every file a role writes is readable by its user only (mode 0600, directories
    0700), whatever the umask, and no process of its user but root may read its
    memory (nor that of the app processes it starts). App processes run as the
    role's user unless --app-user names another.
    """
    from fedcore.apps.environment import check_passed
    from fedcore.apps.run_config import resolve_run_config
    from fedcore.errors import UsageError
    from fedcore.non_dumpable import make_non_dumpable
    from fedcore.roles.exec.app_user import AppUser
    from fedcore.roles.exec.launcher import LaunchSettings
    from fedcore.runtime.addresses import parse_address
    from fedcore.runtime.exec import serve_node_exec
    from fedcore.runtime.link import LinkOptions, serve_link
    from fedcore.runtime.node import NodeOptions, serve_node
    from fedcore.runtime.tls import server_context
    from fedcore.transport.grpc.guard import FleetLimits
    from fedcore.transport.http.guard import HttpLimits

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    make_non_dumpable()
    if app_user is not None and exec_socket is not None:
        raise click.UsageError(
            "--app-user is for a link, an exec of a link, or a node starting its ClientApps "
            "itself: a node's exec (--exec-socket) starts them as its own user"
        )
    try:
        passed = check_passed(app_env)
        user = AppUser.named(app_user) if app_user is not None else None
    except UsageError as exc:
        raise click.UsageError(str(exc)) from None
    launch = LaunchSettings(
        claim_lease=claim_lease,
        max_runs=max_runs,
        max_restarts=max_restarts,
        app_heartbeat=heartbeat_interval,
        app_env=passed,
        app_user=user,
        max_value_len=max_value_bytes,
        # A link stopped here (Ctrl-C, SIGTERM) is one an operator restarts: its runs in
        # progress wait for it, as they do after a kill, rather than fail.
        leave_apps_running=role == "link",
    )
    os.umask(PRIVATE_UMASK)
    if role == "link":
        if (ssl_certfile is None) != (ssl_keyfile is None):
            raise click.UsageError("--ssl-certfile and --ssl-keyfile go together")
        tls = exec_tls = None
        if ssl_certfile is not None and ssl_keyfile is not None:
            tls = server_context(ssl_certfile, ssl_keyfile, ssl_ca_certfile, alpn=["h2"])
            exec_tls = server_context(ssl_certfile, ssl_keyfile, alpn=["http/1.1"])
        if (control_ssl_certfile is None) != (control_ssl_keyfile is None):
            raise click.UsageError("--control-ssl-certfile and --control-ssl-keyfile go together")
        control_tls = None
        if control_ssl_certfile is not None and control_ssl_keyfile is not None:
            control_tls = server_context(
                control_ssl_certfile, control_ssl_keyfile, alpn=["http/1.1"]
            )
        options = LinkOptions(
            fleet_address=parse_address(fleet_address, what="--fleet-address"),
            control_address=parse_address(control_address, what="--control-address"),
            runtime_address=parse_address(
                runtime_address or RUNTIME_ADDRESS, what="--runtime-address"
            ),
            database=database,
            work_dir=work_dir or Path(".fedcore-link"),
            ready_file=ready_file,
            fleet_ssl=tls,
            insecure=insecure,
            launch=launch,
            exec_address=parse_address(exec_address, what="--exec-address")
            if exec_address
            else None,
            exec_secret_file=exec_secret_file,
            exec_ssl=exec_tls,
            control_ssl=control_tls,
            control_token_file=control_token_file,
            local_exec=not no_local_exec,
            heartbeat_patience=heartbeat_patience,
            max_heartbeat_interval=max_heartbeat_interval,
            retire_nodes_after=retire_nodes_after or None,
            max_value_len=max_value_bytes,
            authorized_nodes=authorized_nodes,
            fleet_limits=FleetLimits(
                idle_timeout=fleet_idle_timeout,
                body_timeout=fleet_body_timeout,
                connections_per_peer=fleet_connections_per_peer,
                max_connections=fleet_max_connections,
                requests_per_second=fleet_requests_per_second,
                request_burst=max(1, round(2 * fleet_requests_per_second)),
                requests_per_second_per_key=fleet_requests_per_second_per_key,
                request_burst_per_key=max(1, round(2 * fleet_requests_per_second_per_key)),
                registrations_per_second=fleet_registrations_per_second,
                registration_burst=fleet_registration_burst,
                registrations_per_second_total=fleet_registrations_per_second_total,
                registration_burst_total=2 * fleet_registration_burst,
            ),
            http_limits=HttpLimits(
                header_timeout=http_header_timeout,
                body_timeout=http_body_timeout,
                idle_timeout=http_idle_timeout,
                connections_per_peer=http_connections_per_peer,
                max_connections=http_max_connections,
            ),
        )
        options.check()
        if options.local_exec and user is None:
            stored = [] if database == ":memory:" else [f"the link's database {database}"]
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
        _serve_until_signal(lambda: serve_link(options), "the link")
        return
    if role == "exec" and exec_socket is not None:
        if link_exec is not None or exec_secret_file is None:
            raise click.UsageError(
                "an exec serves a link (--link-exec) or a node (--exec-socket), not both; "
                "either way it needs --exec-secret-file"
            )
        _warn_same_user(
            "ClientApp",
            [f"the exec secret {exec_secret_file}", "every file this user can"],
            "Run this exec as a user of its own, not the node's (the node's key is then out "
            "of reach).",
        )
        _serve_until_signal(
            lambda: serve_node_exec(exec_socket, exec_secret_file, ready_file, app_env=passed),
            "the exec",
        )
        return
    if role == "exec":
        _serve_exec(
            link_exec,
            exec_secret_file,
            runtime_address,
            work_dir,
            insecure,
            root_certificates,
            launch,
            ready_file,
        )
        return
    if link is None:
        raise click.UsageError("--role node needs --link HOST:PORT (the link's fleet address)")
    link_address = parse_address(link, what="--link")
    node_options = NodeOptions(
        link=link_address,
        node_config=resolve_run_config(None, node_config) if node_config else {},
        work_dir=work_dir or Path(".fedcore-node"),
        heartbeat_interval=heartbeat_interval,
        max_concurrent=max_concurrent,
        num_cpus=num_cpus,
        ssl=_link_tls(
            link_address,
            root_certificates,
            insecure,
            alpn=["h2"],
            client=(ssl_certfile, ssl_keyfile),
        ),
        ready_file=ready_file,
        exec_socket=exec_socket,
        exec_secret_file=exec_secret_file,
        auth_key=auth_key,
        app_env=passed,
        max_value_len=max_value_bytes,
        app_user=user,
    )
    if exec_socket is not None and exec_secret_file is None:
        raise click.UsageError("--exec-socket needs --exec-secret-file (the exec's secret)")
    _serve_until_signal(lambda: serve_node(node_options), "the node")


def _warn_same_user(apps: str, reachable: list[str], remedy: str) -> None:
    """Say once, at start, what the app processes of a role running as its user can reach."""
    from fedcore.roles.exec.app_user import same_user_warning

    logging.getLogger("fedcore.serve").warning(same_user_warning(apps, reachable, remedy))


def _serve_exec(
    link_exec: str | None,
    secret_file: Path | None,
    runtime_address: str | None,
    work_dir: Path | None,
    insecure: bool,
    root_certificates: Path | None,
    launch: LaunchSettings,
    ready_file: Path | None,
) -> None:
    if link_exec is None or secret_file is None:
        raise click.UsageError(
            "--role exec needs --link-exec HOST:PORT (the link's exec API) and "
            "--exec-secret-file PATH (the secret it shares with the link)"
        )
    from fedcore.runtime.addresses import parse_address
    from fedcore.runtime.exec import ExecOptions, serve_exec

    link = parse_address(link_exec, what="--link-exec")
    if runtime_address is not None:
        parse_address(runtime_address, what="--runtime-address")
    if launch.app_user is None:
        _warn_same_user(
            "ServerApp",
            [
                f"the exec secret {secret_file} (and with it the link's exec API: claim runs, "
                "with their bundles and launch secrets)",
                f"its work directory {work_dir or Path('.fedcore-exec')} (every run's output)",
            ],
            "Give --app-user USER (the exec running as root).",
        )
    options = ExecOptions(
        link=link,
        secret_file=secret_file,
        runtime_address=runtime_address,
        work_dir=work_dir or Path(".fedcore-exec"),
        ready_file=ready_file,
        ssl=_link_tls(link, root_certificates, insecure),
        launch=launch,
    )
    _serve_until_signal(lambda: serve_exec(options), "the exec")


def _link_tls(
    link: Address,
    root_certificates: Path | None,
    insecure: bool,
    alpn: list[str] | None = None,
    client: tuple[Path | None, Path | None] = (None, None),
) -> ssl.SSLContext | None:
    """TLS to the link, trusting ``root_certificates``; plaintext only on loopback or insecure.

    ``client`` is the certificate and key to present, for a link that asks for one.
    """
    from fedcore.runtime.tls import client_context

    certfile, keyfile = client
    if (certfile is None) != (keyfile is None):
        raise click.UsageError("--ssl-certfile and --ssl-keyfile go together")
    if certfile is not None and root_certificates is None:
        raise click.UsageError("a client certificate needs --root-certificates (TLS to the link)")
    if root_certificates is not None:
        return client_context(root_certificates, certfile, keyfile, alpn=alpn)
    if not insecure and not link.is_loopback:
        raise click.UsageError(
            "connecting to a link on another machine needs TLS: give --root-certificates, "
            "or --insecure to accept plaintext"
        )
    return None


def _serve_until_signal(serve_role: Callable[[], Awaitable[None]], what: str) -> None:
    """Serve until the role returns or SIGINT or SIGTERM stops it; a stopped role ends well.

    SIGHUP is left to the role (the link reloads its authorized nodes on it).
    """
    from fedcore.errors import FedcoreError, first_error
    from fedcore.event_loop import run_until_ended

    try:
        run_until_ended(
            serve_role, what, signals=(signal.SIGINT, signal.SIGTERM), end_as_received=False
        )
    except ExceptionGroup as group:
        # A role that cannot start (a secret refused, a file unreadable) says why in one
        # line, as any other error a person can fix; anything else keeps its traceback.
        errors, _ = group.split(FedcoreError)
        if errors is None:
            raise
        raise first_error(errors) from None


def _spool_in(directory: Path) -> None:
    """Have this process spool large payloads (:mod:`fedcore.wire.spool`) in ``directory``.

    The link relays models in temporary files: in its work directory they are on the
    disk the operator chose for it, rather than in a ``/tmp`` that may be a memory
    file system. The files have no names, so nothing is left there after a crash.
    """
    directory.mkdir(parents=True, exist_ok=True)
    tempfile.tempdir = str(directory)
