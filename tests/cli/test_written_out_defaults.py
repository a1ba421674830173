"""`fedcore serve` and `fedcore simulate` show the library's defaults without importing the
runtime or the simulation: the values they write out are the ones those use."""

from __future__ import annotations

import click

from fedcore.cli import serve as serve_cli
from fedcore.cli import simulate as simulate_cli
from fedcore.roles.exec.launcher import LaunchSettings
from fedcore.roles.link.fleet import MAX_HEARTBEAT_INTERVAL
from fedcore.roles.link.retirement import RETIRE_NODES_AFTER
from fedcore.runtime.link import RUNTIME_ADDRESS, LinkOptions
from fedcore.simulation.backends import BACKENDS, DEFAULT_BACKEND
from fedcore.state.base import DEFAULT_HEARTBEAT_PATIENCE
from fedcore.strategy.rounds import DEFAULT_ROUND_TIMEOUT
from fedcore.transport.grpc.guard import FleetLimits
from fedcore.transport.http.guard import HttpLimits
from fedcore.wire import MAX_VALUE_LEN


def _default(name: str) -> object:
    command = serve_cli.serve
    assert isinstance(command, click.Command)
    (option,) = [param for param in command.params if param.name == name]
    return option.default


def test_the_written_out_defaults_are_the_librarys() -> None:
    settings = LaunchSettings()
    assert serve_cli.CLAIM_LEASE == settings.claim_lease == _default("claim_lease")
    assert serve_cli.MAX_RUNS == settings.max_runs == _default("max_runs")
    assert serve_cli.MAX_RESTARTS == settings.max_restarts == _default("max_restarts")
    assert serve_cli.MAX_VALUE_LEN == settings.max_value_len == _default("max_value_bytes")
    assert serve_cli.MAX_VALUE_LEN == MAX_VALUE_LEN
    assert serve_cli.HEARTBEAT_INTERVAL == settings.app_heartbeat == _default("heartbeat_interval")
    assert serve_cli.HEARTBEAT_PATIENCE == DEFAULT_HEARTBEAT_PATIENCE
    assert _default("heartbeat_patience") == DEFAULT_HEARTBEAT_PATIENCE
    assert str(RUNTIME_ADDRESS) == serve_cli.RUNTIME_ADDRESS
    fleet = FleetLimits()
    assert serve_cli.FLEET_IDLE_TIMEOUT == fleet.idle_timeout == _default("fleet_idle_timeout")
    assert serve_cli.FLEET_BODY_TIMEOUT == fleet.body_timeout == _default("fleet_body_timeout")
    peer, total, rate = (
        fleet.connections_per_peer,
        fleet.max_connections,
        fleet.requests_per_second,
    )
    assert (peer, total, rate) == (
        serve_cli.FLEET_CONNECTIONS_PER_PEER,
        serve_cli.FLEET_MAX_CONNECTIONS,
        serve_cli.FLEET_REQUESTS_PER_SECOND,
    )
    assert (peer, total, rate) == (
        _default("fleet_connections_per_peer"),
        _default("fleet_max_connections"),
        _default("fleet_requests_per_second"),
    )
    assert fleet.request_burst == 2 * fleet.requests_per_second
    assert (
        fleet.requests_per_second_per_key,
        fleet.registrations_per_second,
        fleet.registration_burst,
        fleet.registrations_per_second_total,
    ) == (
        serve_cli.FLEET_REQUESTS_PER_SECOND_PER_KEY,
        serve_cli.FLEET_REGISTRATIONS_PER_SECOND,
        serve_cli.FLEET_REGISTRATION_BURST,
        serve_cli.FLEET_REGISTRATIONS_PER_SECOND_TOTAL,
    )
    assert (
        _default("fleet_requests_per_second_per_key"),
        _default("fleet_registrations_per_second"),
        _default("fleet_registration_burst"),
        _default("fleet_registrations_per_second_total"),
    ) == (
        serve_cli.FLEET_REQUESTS_PER_SECOND_PER_KEY,
        serve_cli.FLEET_REGISTRATIONS_PER_SECOND,
        serve_cli.FLEET_REGISTRATION_BURST,
        serve_cli.FLEET_REGISTRATIONS_PER_SECOND_TOTAL,
    )
    assert fleet.request_burst_per_key == 2 * fleet.requests_per_second_per_key
    assert fleet.registration_burst_total == 2 * fleet.registration_burst
    assert serve_cli.MAX_HEARTBEAT_INTERVAL == MAX_HEARTBEAT_INTERVAL
    assert _default("max_heartbeat_interval") == MAX_HEARTBEAT_INTERVAL
    assert serve_cli.RETIRE_NODES_AFTER == RETIRE_NODES_AFTER == _default("retire_nodes_after")
    assert LinkOptions().max_heartbeat_interval == MAX_HEARTBEAT_INTERVAL
    assert LinkOptions().retire_nodes_after == RETIRE_NODES_AFTER
    http = HttpLimits()
    for name in (
        "header_timeout",
        "body_timeout",
        "idle_timeout",
        "connections_per_peer",
        "max_connections",
    ):
        written = getattr(serve_cli, f"HTTP_{name.upper()}")
        assert written == getattr(http, name) == _default(f"http_{name}"), name


def test_simulate_writes_out_the_simulations_choices() -> None:
    command = simulate_cli.simulate
    assert isinstance(command, click.Command)
    (backend,) = [param for param in command.params if param.name == "backend"]
    assert isinstance(backend.type, click.Choice)
    assert tuple(backend.type.choices) == simulate_cli.BACKENDS == BACKENDS
    assert backend.default == simulate_cli.DEFAULT_BACKEND == DEFAULT_BACKEND
    assert simulate_cli.DEFAULT_ROUND_TIMEOUT == DEFAULT_ROUND_TIMEOUT
    assert simulate_cli.MAX_VALUE_LEN == MAX_VALUE_LEN
