"""The options of ``fedcore serve``, each written once, with the roles that take it.

Each role's command (:mod:`fedcore.cli.serve_roles`) takes the options listed for it;
``fedcore serve --help`` shows them all, each with the roles it is for. The defaults
shown come from :mod:`fedcore.defaults`, so the help imports none of the runtime.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

import fedcore.defaults as defaults

LINK = frozenset({"link"})
NODE = frozenset({"node"})
EXEC = frozenset({"exec"})
ROLES = ("link", "node", "exec")


def _option(
    roles: frozenset[str], *declarations: str, **attributes: Any
) -> tuple[frozenset[str], click.Option]:
    return roles, click.Option(list(declarations), **attributes)


OPTIONS: tuple[tuple[frozenset[str], click.Option], ...] = (
    _option(
        LINK,
        "--fleet-address",
        default=defaults.FLEET_ADDRESS,
        show_default=True,
        help="[link] Where nodes connect (gRPC). Port 0 picks a free port.",
    ),
    _option(
        LINK,
        "--control-address",
        default=defaults.CONTROL_ADDRESS,
        show_default=True,
        help="[link] Where `fedcore run/ls/log/stop` connect (HTTP; HTTPS with "
        "--control-ssl-certfile). Every request but GET /v1/health needs the control token. "
        "Off loopback it needs TLS, or --insecure.",
    ),
    _option(
        LINK | EXEC,
        "--runtime-address",
        help=f"[link] Where ServerApp processes connect (HTTP); loopback, as they run on this "
        f"machine (default: {defaults.RUNTIME_ADDRESS}). Port 0 picks a free port the first "
        "time and the same one on a restart (kept in the work dir's runtime.port), so the "
        "ServerApps of runs in progress reach the restarted link. [exec] Where the ServerApps "
        "it launches reach the link's runtime API (default: the address the link gives).",
    ),
    _option(
        LINK,
        "--exec-address",
        help="[link] Also serve the exec API here (HTTP, every request signed with the shared "
        "secret), for execs started with `fedcore serve --role exec`. Port 0 picks a free port. "
        "Off loopback it uses TLS (--ssl-certfile/--ssl-keyfile).",
    ),
    _option(
        LINK | NODE | EXEC,
        "--exec-secret-file",
        type=click.Path(dir_okay=False, path_type=Path),
        help="[link, node, exec] The secret a link or node shares with its execs; made (random, "
        "mode 0600) if missing. Default for the link: exec.secret in its work directory; required "
        "for an exec, and for a node with --exec-socket.",
    ),
    _option(
        LINK,
        "--no-local-exec",
        is_flag=True,
        help="[link] Launch no ServerApp in the link process: leave every run to external execs "
        "(needs --exec-address).",
    ),
    _option(
        EXEC,
        "--link-exec",
        help="[exec] The link's exec API address, HOST:PORT.",
    ),
    _option(
        NODE | EXEC,
        "--exec-socket",
        type=click.Path(dir_okay=False, path_type=Path),
        help="[node, exec] The Unix socket of a node's exec. An exec given it listens there and "
        "starts the node's ClientApp processes (instead of --link-exec); a node given it has that "
        "exec start them, instead of starting them itself (process isolation).",
    ),
    _option(
        LINK | EXEC,
        "--claim-lease",
        type=click.FloatRange(min=0, min_open=True),
        default=defaults.CLAIM_LEASE,
        show_default=True,
        help="[link, exec] Seconds a claim on a run lasts unless renewed (every third of it); "
        "the run of an exec that dies before launching it goes back to pending after that.",
    ),
    _option(
        LINK | EXEC,
        "--max-runs",
        type=click.IntRange(min=1),
        default=defaults.MAX_RUNS,
        show_default=True,
        help="[link, exec] ServerApp processes launched at once.",
    ),
    _option(
        LINK | EXEC,
        "--max-restarts",
        type=click.IntRange(min=0),
        default=defaults.MAX_RESTARTS,
        show_default=True,
        help="[link, exec] Times a run's ServerApp process that crashed or was killed is "
        "started again before the run fails (0: it fails at once, and the ServerApp keeps "
        "no round checkpoints). The new process goes on from the last round finished, "
        "kept on the link; the nodes keep their contexts.",
    ),
    _option(
        LINK,
        "--database",
        default=defaults.DATABASE,
        show_default=True,
        help="[link] The SQLite file holding runs, nodes and messages across restarts; "
        "':memory:' keeps nothing.",
    ),
    _option(
        LINK | NODE | EXEC,
        "--work-dir",
        type=click.Path(file_okay=False, path_type=Path),
        help="Bundles, process output and (link) large models in transit (default: .fedcore-link, "
        ".fedcore-node or .fedcore-exec here).",
    ),
    _option(
        LINK | NODE | EXEC,
        "--insecure",
        is_flag=True,
        help="Accept plaintext on listeners other machines can reach (the control API's token "
        "then crosses the network in the clear).",
    ),
    _option(
        LINK,
        "--control-token-file",
        type=click.Path(dir_okay=False, path_type=Path),
        help="[link] Where the control API's bearer token is kept (created, random, mode 0600, "
        "if missing; default: control.token in the work directory). The control API always "
        "wants it; `fedcore run/ls/log/stop` send --token-file, $FEDCORE_CONTROL_TOKEN, or "
        ".fedcore-link/control.token when run where a link with the default work directory runs.",
    ),
    _option(
        LINK,
        "--control-ssl-certfile",
        type=click.Path(dir_okay=False, path_type=Path),
        help="[link] TLS certificate for the control API (HTTPS); `fedcore run/ls/log/stop` "
        "verify it with --root-certificates.",
    ),
    _option(
        LINK,
        "--control-ssl-keyfile",
        type=click.Path(dir_okay=False, path_type=Path),
        help="[link] The key of --control-ssl-certfile.",
    ),
    _option(
        LINK | NODE,
        "--ssl-certfile",
        type=click.Path(dir_okay=False, path_type=Path),
        help="[link] TLS certificate (fleet and exec APIs). [node] Its client certificate, for a "
        "link started with --ssl-ca-certfile.",
    ),
    _option(
        LINK | NODE,
        "--ssl-keyfile",
        type=click.Path(dir_okay=False, path_type=Path),
        help="[link, node] The key of --ssl-certfile.",
    ),
    _option(
        LINK,
        "--ssl-ca-certfile",
        type=click.Path(dir_okay=False, path_type=Path),
        help="[link] CA for client certificates: nodes must present one it signed (mutual TLS, "
        "a node's --ssl-certfile/--ssl-keyfile).",
    ),
    _option(
        NODE,
        "--link",
        "link",
        help="[node] The link's fleet address, HOST:PORT.",
    ),
    _option(
        NODE,
        "--node-config",
        default="",
        help='[node] This node\'s config: "partition-id=0 num-partitions=2".',
    ),
    _option(
        NODE | EXEC,
        "--root-certificates",
        type=click.Path(dir_okay=False, path_type=Path),
        help="[node, exec] CA certificates to verify the link with (TLS).",
    ),
    _option(
        LINK | NODE | EXEC,
        "--heartbeat-interval",
        type=click.FloatRange(min=0, min_open=True),
        default=defaults.HEARTBEAT_INTERVAL,
        show_default=True,
        help="[node] Seconds between this node's heartbeats (at most the link's "
        "--max-heartbeat-interval). [link, exec] Seconds between the "
        "heartbeats of the ServerApp processes it launches. The link declares a node offline, "
        "or a ServerApp silent, after --heartbeat-patience times that without one.",
    ),
    _option(
        LINK,
        "--heartbeat-patience",
        type=click.FloatRange(min=1),
        default=defaults.HEARTBEAT_PATIENCE,
        show_default=True,
        help="[link] How many heartbeat intervals a node or a ServerApp may stay silent. A "
        "ServerApp whose exec still holds its running process is never failed for silence; one "
        "that exits fails its run at once. Stalls of the link's own event loop do not count.",
    ),
    _option(
        LINK,
        "--max-heartbeat-interval",
        type=click.FloatRange(min=0, min_open=True),
        default=defaults.MAX_HEARTBEAT_INTERVAL,
        show_default=True,
        help="[link] The longest heartbeat interval a node may declare. A node declaring more is "
        "refused (INVALID_ARGUMENT, naming this bound) at registration and at each heartbeat, "
        "so that every node that stops beating is offline within --heartbeat-patience times this.",
    ),
    _option(
        LINK,
        "--retire-nodes-after",
        type=click.FloatRange(min=0),
        default=defaults.RETIRE_NODES_AFTER,
        show_default=True,
        metavar="SECONDS",
        help="[link] Delete a node offline this long, from memory and the database (0: never). "
        "Under trust on first use any key registers: this is how long the registrations nobody "
        "uses again are kept. A node that comes back later registers again, as a new node.",
    ),
    _option(
        NODE,
        "--max-concurrent",
        type=click.IntRange(min=1),
        default=defaults.MAX_CONCURRENT,
        show_default=True,
        help="[node] Messages handled at once.",
    ),
    _option(
        NODE,
        "--num-cpus",
        type=click.FloatRange(min=0, min_open=True),
        help="[node] CPUs each ClientApp process may use: OMP_NUM_THREADS, MKL_NUM_THREADS and "
        "OPENBLAS_NUM_THREADS (so BLAS, OpenMP and torch) are set to this, rounded up, in its "
        "environment; one already set is kept (default: this machine's CPUs ÷ --max-concurrent).",
    ),
    _option(
        NODE,
        "--auth-key",
        type=click.Path(dir_okay=False, path_type=Path),
        help="[node] The node's signing key (PEM; Ed25519, ECDSA P-256 or P-384, as `fedcore "
        "keygen` writes): the link knows the node by it, and every fleet request is signed with "
        "it (default: node.key in --work-dir, made on first start, mode 0600).",
    ),
    _option(
        LINK,
        "--authorized-nodes",
        type=click.Path(dir_okay=False, exists=True, path_type=Path),
        help="[link] Admit only the nodes whose public keys this file lists, one per line "
        "(OpenSSH or PEM form; # comments). Without it any key may register: a node is "
        "known by the first key it registers with (trust on first use).",
    ),
    _option(
        LINK,
        "--fleet-idle-timeout",
        type=click.FloatRange(min=0, min_open=True),
        default=defaults.FLEET_IDLE_TIMEOUT,
        show_default=True,
        help="[link] Seconds a fleet connection with no call in progress may stay silent before "
        "the link closes it (idle and half-open sockets; TCP keepalive finds dead peers mid-call).",
    ),
    _option(
        LINK,
        "--fleet-body-timeout",
        type=click.FloatRange(min=0, min_open=True),
        default=defaults.FLEET_BODY_TIMEOUT,
        show_default=True,
        help="[link] Seconds one request frame may take to arrive once its call began; a stalled "
        "call ends INVALID_ARGUMENT.",
    ),
    _option(
        LINK,
        "--fleet-connections-per-peer",
        type=click.IntRange(min=1),
        default=defaults.FLEET_CONNECTIONS_PER_PEER,
        show_default=True,
        help="[link] Fleet connections one IP address may hold open (nodes behind one NAT share "
        "an address); more are closed on arrival.",
    ),
    _option(
        LINK,
        "--fleet-max-connections",
        type=click.IntRange(min=1),
        default=defaults.FLEET_MAX_CONNECTIONS,
        show_default=True,
        help="[link] Fleet connections at once (and the connections of all the link's APIs "
        "together, 64 under the open-file limit). At a cap a new connection closes the one idle "
        "the longest (or is refused if none is idle).",
    ),
    _option(
        LINK,
        "--fleet-requests-per-second",
        type=click.FloatRange(min=0, min_open=True),
        default=defaults.FLEET_REQUESTS_PER_SECOND,
        show_default=True,
        help="[link] Fleet calls one IP address may start per second on average (bursts of twice "
        "that); more end RESOURCE_EXHAUSTED with a hint of how long to wait (nodes back off and "
        "retry), and the link logs the flood once a minute.",
    ),
    _option(
        LINK,
        "--fleet-requests-per-second-per-key",
        type=click.FloatRange(min=0, min_open=True),
        default=defaults.FLEET_REQUESTS_PER_SECOND_PER_KEY,
        show_default=True,
        help="[link] Fleet calls one node key may make per second on average (bursts of twice "
        "that), from any address, once its signature is checked; more end RESOURCE_EXHAUSTED.",
    ),
    _option(
        LINK,
        "--fleet-registrations-per-second",
        type=click.FloatRange(min=0, min_open=True),
        default=defaults.FLEET_REGISTRATIONS_PER_SECOND,
        show_default=True,
        help="[link] Node registrations one IP address may make per second on average, after a "
        "burst of --fleet-registration-burst; more end RESOURCE_EXHAUSTED (a node retries).",
    ),
    _option(
        LINK,
        "--fleet-registration-burst",
        type=click.IntRange(min=1),
        default=defaults.FLEET_REGISTRATION_BURST,
        show_default=True,
        help="[link] Node registrations one IP address may make at once (a fleet behind one NAT "
        "starting together); the link in all, twice that.",
    ),
    _option(
        LINK,
        "--fleet-registrations-per-second-total",
        type=click.FloatRange(min=0, min_open=True),
        default=defaults.FLEET_REGISTRATIONS_PER_SECOND_TOTAL,
        show_default=True,
        help="[link] Node registrations per second from all addresses together, on average.",
    ),
    _option(
        LINK,
        "--http-header-timeout",
        type=click.FloatRange(min=0, min_open=True),
        default=defaults.HTTP_HEADER_TIMEOUT,
        show_default=True,
        help="[link] Seconds a request to the control, runtime or exec API may take to send its "
        "headers, from its first byte; a slower one (slowloris) has its connection closed.",
    ),
    _option(
        LINK,
        "--http-body-timeout",
        type=click.FloatRange(min=0, min_open=True),
        default=defaults.HTTP_BODY_TIMEOUT,
        show_default=True,
        help="[link] Seconds a request to those APIs may take to send its body (a run's bundle, a "
        "ServerApp's model), from the end of its headers; then its connection is closed.",
    ),
    _option(
        LINK,
        "--http-idle-timeout",
        type=click.FloatRange(min=0, min_open=True),
        default=defaults.HTTP_IDLE_TIMEOUT,
        show_default=True,
        help="[link] Seconds a connection to those APIs may stay silent between requests.",
    ),
    _option(
        LINK,
        "--http-connections-per-peer",
        type=click.IntRange(min=1),
        default=defaults.HTTP_CONNECTIONS_PER_PEER,
        show_default=True,
        help="[link] Connections one IP address may hold open to each of those APIs; more are "
        "closed on arrival.",
    ),
    _option(
        LINK,
        "--http-max-connections",
        type=click.IntRange(min=1),
        default=defaults.HTTP_MAX_CONNECTIONS,
        show_default=True,
        help="[link] Connections to each of those APIs at once (and to all the link's APIs "
        "together, 64 under the open-file limit). At a cap a new connection closes the one idle "
        "the longest (or is refused if none is idle).",
    ),
    _option(
        LINK | NODE | EXEC,
        "--max-value-bytes",
        type=click.IntRange(min=1),
        default=defaults.MAX_VALUE_LEN,
        metavar="BYTES",
        help="[link, node, exec] The most bytes one str or bytes value of a record may take (a "
        "model serialized into a ConfigRecord, say). A link refuses a longer one in what it "
        "decodes (nodes' replies, what its ServerApps push) and its ServerApps refuse to push "
        "one; a node refuses a longer one in the messages it pulls (an error reply) and its "
        "ClientApps' replies holding one become error replies (code 2). An exec gives it to the "
        "ServerApps it launches. Give a link, its execs and its nodes the same cap. Default: "
        f"{defaults.MAX_VALUE_LEN} (512 MiB, Flower's cap on a message).",
    ),
    _option(
        LINK | NODE | EXEC,
        "--app-env",
        "app_env",
        multiple=True,
        metavar="NAME",
        help="[link, node, exec] Pass this variable of the environment on to the app processes "
        "started here (repeatable). They get only PATH, HOME, LANG, LC_*, TMPDIR, TZ, "
        "PYTHONPATH, VIRTUAL_ENV, LD_LIBRARY_PATH, CUDA_*, the thread variables and the like "
        "(docs/security.md, Isolation): no secret of this process's. FEDCORE_* variables are "
        "never passed.",
    ),
    _option(
        LINK | NODE | EXEC,
        "--app-user",
        metavar="USER",
        help="[link, exec] Run the ServerApp processes launched here as USER; [node] its "
        "ClientApp processes (needs root; not root itself). Each gets a private copy of its app; "
        "USER must be able to run this Python. Without it app processes run as this role's user "
        "and can read its files: the link's database and control token, a node's key (a warning "
        "at start says which).",
    ),
    _option(
        LINK | NODE | EXEC,
        "--ready-file",
        type=click.Path(dir_okay=False, path_type=Path),
        help="Write the bound addresses and pid here (JSON) once serving (for scripts and tests).",
    ),
)
"""Every option of ``fedcore serve`` but ``--role``, in the order its help lists them, with
the roles that take it."""


def options_of(role: str) -> list[click.Option]:
    """The options ``role``'s command takes."""
    return [option for roles, option in OPTIONS if role in roles]
