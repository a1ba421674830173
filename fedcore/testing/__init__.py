"""Test support for fedcore and for code built on it.

``FakeClock`` makes time-driven behaviour (TTLs, leases, heartbeats, timeouts) testable
in milliseconds; ``fedcore.testing.linkstate`` is the conformance suite every LinkState
implementation must pass; ``fedcore.testing.plugin`` is a pytest plugin with the
fixtures (enable it with ``-p fedcore.testing.plugin``).
"""

from fedcore.testing.clock import FakeClock
from fedcore.testing.reports import round_reports

__all__ = ["FakeClock", "round_reports"]
