"""Who may speak to a link, and for whom: every credential fedcore checks, in one place.

Node keys and their signatures, sessions, the replay window and link names, the fleet
gate, the exec API's shared-secret signatures, the control token, the authorized
nodes and the secret files they live in. The transports hand what arrived to
:func:`fedcore.auth.admission.admit`, which says yes or raises
:class:`~fedcore.errors.AuthenticationError`; they decode nothing of a request before.
"""
