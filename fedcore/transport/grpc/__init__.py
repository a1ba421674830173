"""The fleet API over gRPC (grpclib): a server for any FleetService, and a client that is one."""

from fedcore.transport.grpc.client import GrpcFleetClient
from fedcore.transport.grpc.server import FleetListener, serve_fleet

__all__ = ["FleetListener", "GrpcFleetClient", "serve_fleet"]
