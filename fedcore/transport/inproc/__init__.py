"""In-process transport: simulation, where the ServerApp and the LinkState share a loop."""
