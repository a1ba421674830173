"""Composition roots: bind sockets, enter the roles into one task group, handle signals."""
