"""The simulation runtime: one process, many virtual nodes, a pluggable backend."""

from fedcore.simulation.engine import SimulationEngine, SimulationResult
from fedcore.simulation.resources import Resources
from fedcore.simulation.simulate import run_simulation, simulate

__all__ = ["Resources", "SimulationEngine", "SimulationResult", "run_simulation", "simulate"]
