"""The roles of a deployment: link (hub), node (a device or silo) and exec (launcher).

Each role is plain async code over domain interfaces — a LinkState, a FleetService —
so it runs the same in-process in a test and behind a network transport in
production. Roles never import grpclib or aiohttp: the composition roots in
:mod:`fedcore.runtime` bind sockets and hand the roles their transports.
"""
