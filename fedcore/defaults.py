"""The defaults ``fedcore serve`` and ``fedcore simulate`` show in their help, and use.

One home, importing nothing: ``--help`` reads them without loading the runtime or the
simulation, and the library's settings take their defaults from here (each value
names where). tests/cli/test_written_out_defaults.py holds the commands' options to
the flags their roles take.
"""

from __future__ import annotations

# fedcore serve: where a link listens.
FLEET_ADDRESS = "0.0.0.0:9092"
CONTROL_ADDRESS = "127.0.0.1:9093"
RUNTIME_ADDRESS = "127.0.0.1:0"
"""``fedcore.runtime.link.RUNTIME_ADDRESS``."""
DATABASE = "fedcore-link.db"

# fedcore serve: the runs a link or an exec launches.
CLAIM_LEASE = 10.0
"""``LaunchSettings.claim_lease``."""
MAX_RUNS = 8
"""``LaunchSettings.max_runs``."""
MAX_RESTARTS = 1
"""``LaunchSettings.max_restarts``."""
HEARTBEAT_INTERVAL = 5.0
"""Seconds between heartbeats, of nodes and of ServerApps (``LaunchSettings.app_heartbeat``):
with the default patience a dead node is found within 16 s, and one late beat on a
loaded machine is no alarm."""
MAX_CONCURRENT = 1
"""``NodeOptions.max_concurrent``."""

# fedcore serve: the link's view of its nodes.
HEARTBEAT_PATIENCE = 3.0
"""``fedcore.state.base.DEFAULT_HEARTBEAT_PATIENCE``."""
MAX_HEARTBEAT_INTERVAL = 300.0
"""``fedcore.roles.link.fleet.MAX_HEARTBEAT_INTERVAL``."""
RETIRE_NODES_AFTER = 86_400.0
"""``fedcore.roles.link.retirement.RETIRE_NODES_AFTER``."""

# fedcore serve: the link's limits on its fleet API.
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

# fedcore serve: the link's limits on its HTTP APIs (control, runtime, exec).
HTTP_HEADER_TIMEOUT = 20.0
"""``fedcore.transport.http.guard.HttpLimits.header_timeout``, and so on below."""
HTTP_BODY_TIMEOUT = 120.0
HTTP_IDLE_TIMEOUT = 75.0
HTTP_CONNECTIONS_PER_PEER = 1024
HTTP_MAX_CONNECTIONS = 4096

# Both.
MAX_VALUE_LEN = 512 * 1024 * 1024
"""``fedcore.wire.MAX_VALUE_LEN``: Flower's cap on a message."""

# fedcore simulate.
BACKENDS = ("process", "inline", "ray")
"""``fedcore.simulation.backends.BACKENDS``."""
DEFAULT_BACKEND = "process"
"""``fedcore.simulation.backends.DEFAULT_BACKEND``."""
DEFAULT_ROUND_TIMEOUT = 600.0
"""``fedcore.strategy.rounds.DEFAULT_ROUND_TIMEOUT``."""
