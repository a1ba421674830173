"""`fedcore serve` and `fedcore simulate` show the library's defaults without importing the
runtime or the simulation: the values fedcore/defaults.py writes out are the ones those use,
and the options of `fedcore serve` are the flags its roles take."""

from __future__ import annotations

import dataclasses
import re

import click
import pytest

import fedcore.defaults as defaults
from fedcore.cli import simulate as simulate_cli
from fedcore.cli.serve_options import OPTIONS, ROLES, options_of
from fedcore.cli.serve_roles import ROLE_COMMANDS
from fedcore.roles.exec.launcher import LaunchSettings
from fedcore.roles.link.fleet import MAX_HEARTBEAT_INTERVAL
from fedcore.roles.link.retirement import RETIRE_NODES_AFTER
from fedcore.runtime.link import RUNTIME_ADDRESS, LinkOptions
from fedcore.runtime.node import NodeOptions
from fedcore.runtime.serve import ExecFlags, LinkFlags, NodeFlags
from fedcore.simulation.backends import BACKENDS, DEFAULT_BACKEND
from fedcore.state.base import DEFAULT_HEARTBEAT_PATIENCE
from fedcore.strategy.rounds import DEFAULT_ROUND_TIMEOUT
from fedcore.transport.grpc.guard import FleetLimits
from fedcore.transport.http.guard import HttpLimits
from fedcore.wire import MAX_VALUE_LEN


def _default(name: str) -> object:
    (option,) = [option for _, option in OPTIONS if option.name == name]
    return option.default


def test_the_written_out_defaults_are_the_librarys() -> None:
    settings = LaunchSettings()
    assert defaults.CLAIM_LEASE == settings.claim_lease == _default("claim_lease")
    assert defaults.MAX_RUNS == settings.max_runs == _default("max_runs")
    assert defaults.MAX_RESTARTS == settings.max_restarts == _default("max_restarts")
    assert defaults.MAX_VALUE_LEN == settings.max_value_len == _default("max_value_bytes")
    assert defaults.MAX_VALUE_LEN == MAX_VALUE_LEN
    assert defaults.HEARTBEAT_INTERVAL == settings.app_heartbeat == _default("heartbeat_interval")
    assert defaults.HEARTBEAT_PATIENCE == DEFAULT_HEARTBEAT_PATIENCE
    assert _default("heartbeat_patience") == DEFAULT_HEARTBEAT_PATIENCE
    assert str(RUNTIME_ADDRESS) == defaults.RUNTIME_ADDRESS
    fleet = FleetLimits()
    assert defaults.FLEET_IDLE_TIMEOUT == fleet.idle_timeout == _default("fleet_idle_timeout")
    assert defaults.FLEET_BODY_TIMEOUT == fleet.body_timeout == _default("fleet_body_timeout")
    peer, total, rate = (
        fleet.connections_per_peer,
        fleet.max_connections,
        fleet.requests_per_second,
    )
    assert (peer, total, rate) == (
        defaults.FLEET_CONNECTIONS_PER_PEER,
        defaults.FLEET_MAX_CONNECTIONS,
        defaults.FLEET_REQUESTS_PER_SECOND,
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
        defaults.FLEET_REQUESTS_PER_SECOND_PER_KEY,
        defaults.FLEET_REGISTRATIONS_PER_SECOND,
        defaults.FLEET_REGISTRATION_BURST,
        defaults.FLEET_REGISTRATIONS_PER_SECOND_TOTAL,
    )
    assert (
        _default("fleet_requests_per_second_per_key"),
        _default("fleet_registrations_per_second"),
        _default("fleet_registration_burst"),
        _default("fleet_registrations_per_second_total"),
    ) == (
        defaults.FLEET_REQUESTS_PER_SECOND_PER_KEY,
        defaults.FLEET_REGISTRATIONS_PER_SECOND,
        defaults.FLEET_REGISTRATION_BURST,
        defaults.FLEET_REGISTRATIONS_PER_SECOND_TOTAL,
    )
    assert fleet.request_burst_per_key == 2 * fleet.requests_per_second_per_key
    assert fleet.registration_burst_total == 2 * fleet.registration_burst
    assert defaults.MAX_HEARTBEAT_INTERVAL == MAX_HEARTBEAT_INTERVAL
    assert _default("max_heartbeat_interval") == MAX_HEARTBEAT_INTERVAL
    assert defaults.RETIRE_NODES_AFTER == RETIRE_NODES_AFTER == _default("retire_nodes_after")
    assert LinkOptions().max_heartbeat_interval == MAX_HEARTBEAT_INTERVAL
    assert LinkOptions().retire_nodes_after == RETIRE_NODES_AFTER
    assert LinkOptions().database == defaults.DATABASE == _default("database")
    assert NodeOptions.max_concurrent == defaults.MAX_CONCURRENT == _default("max_concurrent")
    assert NodeOptions.heartbeat_interval == defaults.HEARTBEAT_INTERVAL
    assert _default("fleet_address") == defaults.FLEET_ADDRESS
    assert _default("control_address") == defaults.CONTROL_ADDRESS
    assert str(LinkOptions().control_address) == defaults.CONTROL_ADDRESS
    http = HttpLimits()
    for name in (
        "header_timeout",
        "body_timeout",
        "idle_timeout",
        "connections_per_peer",
        "max_connections",
    ):
        written = getattr(defaults, f"HTTP_{name.upper()}")
        assert written == getattr(http, name) == _default(f"http_{name}"), name


def test_simulate_writes_out_the_simulations_choices() -> None:
    command = simulate_cli.simulate
    assert isinstance(command, click.Command)
    (backend,) = [param for param in command.params if param.name == "backend"]
    assert isinstance(backend.type, click.Choice)
    assert tuple(backend.type.choices) == defaults.BACKENDS == BACKENDS
    assert backend.default == defaults.DEFAULT_BACKEND == DEFAULT_BACKEND
    assert defaults.DEFAULT_ROUND_TIMEOUT == DEFAULT_ROUND_TIMEOUT
    assert defaults.MAX_VALUE_LEN == MAX_VALUE_LEN


FLAGS = {"link": LinkFlags, "node": NodeFlags, "exec": ExecFlags}


@pytest.mark.parametrize("role", ROLES)
def test_each_role_command_takes_its_flags_with_their_defaults(role: str) -> None:
    command = ROLE_COMMANDS[role]
    assert command.params == options_of(role)
    fields = {field.name: field for field in dataclasses.fields(FLAGS[role])}
    assert {param.name for param in command.params} == set(fields)
    # What the command gives the role when no option is given: the flags' own defaults.
    given = command.make_context(command.name, []).params
    assert given == {name: field.default for name, field in fields.items()}


def test_every_option_of_serve_is_for_the_roles_its_help_names() -> None:
    for roles, option in OPTIONS:
        assert option.help, option.name
        named = {
            role.strip()
            for tag in re.findall(r"\[([a-z, ]+)\]", option.help)
            for role in tag.split(",")
        }
        # An option whose help names no role is every role's.
        assert set(roles) == (named or set(ROLES)), option.name
