"""The one exception tree of fedcore.

Everything fedcore raises on purpose derives from :class:`FedcoreError`; errors from
grpclib, aiohttp, msgpack or sqlite are translated at the boundary and never escape.
Programming mistakes in author code (a record value of the wrong type, a malformed
``Message``) raise ``TypeError`` / ``ValueError`` at the call that made them, as Python
code is expected to: the builtin ones, or, for ``Message(...)`` arguments that fit none
of its forms, :class:`MessageInitializationError`, a ``TypeError`` (Flower's class).

::

    FedcoreError
    ├── UsageError (ValueError)     bad input from a person: a flag, a target, a config
    │   ├── AppLoadError            an app target that cannot be imported or is not an app
    │   │   └── FlowerImportError (ImportError)
    │   │                           an app's `import flwr…` of a name fedcore lacks
    │   ├── RunConfigError          a run-config key or value the app does not accept
    │   ├── TrackerError            an experiment tracker (--track) that cannot start: not
    │   │                           installed, a bad location, a store that refuses
    │   ├── CheckpointError         a checkpoint a run cannot go on from: damaged, of
    │   │                           another run's strategy, of another format
    │   ├── BundleError             an app directory that cannot be packed, or a bundle
    │   │                           refused on unpacking (wrong hash, unsafe, over a limit)
    │   ├── WrongServiceError       an address that answers, but not as the API asked for
    │   └── AuthenticationError     a credential the receiver refuses: a bearer token, a
    │       │                       request signature, a node key
    │       └── UnknownSessionError a fleet session the link does not hold: sign again
    ├── DecodeError (ValueError)    bytes that are not a valid payload
    ├── ValueTooLargeError (ValueError)
    │                               a record's str or bytes value over the cap on one value
    ├── StateError                  a LinkState refused an operation
    │   ├── NotFoundError (LookupError)
    │   │   ├── RunNotFoundError
    │   │   ├── NodeNotFoundError
    │   │   └── MessageNotFoundError
    │   ├── ConflictError           same id, different content
    │   ├── ReplyRejectedError      a reply to a message that expired or was answered by fedcore
    │   ├── RunFinishedError        messages pushed to a run that has finished
    │   ├── InvalidTransitionError  a lifecycle move the transition table forbids
    │   └── ClaimLostError          a fencing token that is no longer the run's claim
    ├── NotEnoughNodesError (TimeoutError)
    │                               waited for nodes past the timeout
    ├── InconsistentRepliesError (ValueError)
    │                               a round's replies that cannot be aggregated together
    ├── AggregationError (ValueError)
    │                               an aggregate that does not fit the model it updates
    ├── RefusedReplyError (ValueError)
    │                               a training reply a strategy will not aggregate
    ├── ErrorReplyError (ValueError)
    │                               a legacy client call answered by an error reply
    ├── MessageInitializationError (TypeError)
    │                               Message(...) arguments that fit none of its forms
    ├── ResourceError               the machine has no room for it (shared memory, disk)
    ├── LinkUnavailableError (ConnectionError)
    │   │                           the link cannot be reached now; retry with backoff
    │   └── LinkBusyError           the link refused the call for now: too many requests
    └── ClusterUnavailableError (ConnectionError)
                                    the Ray cluster a simulation was pointed at does not
                                    answer (in time)
"""

from __future__ import annotations

from typing import TypeVar

E = TypeVar("E", bound=BaseException)


class FedcoreError(Exception):
    """Base of every error fedcore raises on purpose."""


class UsageError(FedcoreError, ValueError):
    """Bad input from a person: the message is meant to be shown as is, in one line."""


class AppLoadError(UsageError):
    """An app target (``module:attr`` or an app directory) could not be loaded."""


class FlowerImportError(AppLoadError, ImportError):
    """An app imports a ``flwr`` name that fedcore does not provide (yet).

    Raised by the import statement itself, so the app fails where it names the thing,
    not rounds later on a stand-in that does not behave. An ImportError, as a missing
    name is to Python; an AppLoadError, as the app is what cannot be loaded.
    """


class FlowerInternalError(FedcoreError):
    """A ported Flower unit test used a Flower internal that fedcore does not serve.

    Flower's unit tests run here with their import lines rewritten
    (:mod:`fedcore.testing.flower_unit`); a name no public ``flwr`` module of fedcore's
    offers (protobuf serde, inflatable objects, private helpers) becomes a stand-in
    that raises this when the test touches it, so only that test fails. ``name`` is
    the Flower name, as the test imported it.
    """

    def __init__(self, name: str) -> None:
        super().__init__(f"{name} is a Flower internal that fedcore does not serve")
        self.name = name


class RunConfigError(UsageError):
    """A run-config override names an undeclared key or has the wrong type."""


class TrackerError(UsageError):
    """An experiment tracker asked for (``--track``) cannot record the run: its package is
    not installed, its location is wrong, or its store refused to open the run."""


class CheckpointError(UsageError):
    """A round checkpoint that a run cannot go on from (:mod:`fedcore.strategy.checkpoint`)."""


class BundleError(UsageError):
    """An app bundle that cannot be packed or that is refused on unpacking.

    A UsageError on both sides: packing fails on what is in the user's app directory,
    and a bundle refused on a node is still the user's app (or something posing as
    it); either way the one-line message is what a person needs to read.
    """


class WrongServiceError(UsageError):
    """An address that answers, but not with the fedcore API the caller asked for.

    Another port of the link (the fleet API's gRPC where the control API was
    meant), or a server that is not fedcore's: the address given is the mistake,
    so retrying it cannot help.
    """


class AuthenticationError(UsageError):
    """A request the receiver does not accept as coming from who it claims.

    The control API's bearer token missing or not the one it wants; a fleet request's
    signature missing, malformed or wrong, its timestamp stale, its nonce replayed, its
    key not admitted, or the node it names not the signer. A person's to fix (which
    token or key to present, the clocks), so a UsageError: final for that request, and
    a node retrying with the same key gets the same answer. A client adds where the
    credential it sent came from, and where the right one is.
    """


class UnknownSessionError(AuthenticationError):
    """A fleet call authenticated by a session the link does not hold (or no longer admits).

    The link restarted, or the session outlived its time or was replaced: the call
    was refused before anything of it was read, so a node signs it and retries it
    at once (:mod:`fedcore.auth.sessions`).
    """


class WrongLinkError(AuthenticationError):
    """A signed fleet call that names another link, or this link before it restarted.

    A captured request replayed at another link, or after a restart, is refused so;
    so is a node's call signed before it learned the link's current name
    (:mod:`fedcore.auth.signatures`). ``link`` is the name the link goes by now,
    sent back with the refusal: the node signs again for it. ``learning``: the call
    named no link yet (a node's first), which is no sign of a replay.
    """

    def __init__(self, message: str, link: str, *, learning: bool = False) -> None:
        super().__init__(message)
        self.link = link
        self.learning = learning


class DecodeError(FedcoreError, ValueError):
    """Bytes that do not decode to a valid payload under the configured limits."""


class ValueTooLargeError(FedcoreError, ValueError):
    """A record's str or bytes value longer than the cap on one value (``max_value_len``,
    Flower's 512 MiB by default): refused where it is encoded, naming it."""


class ValueOverCapError(DecodeError, ValueTooLargeError):
    """A received record's str or bytes value over the receiver's cap on one value:
    refused as it is decoded, before it is copied. Sent again, it is refused again, so
    a node answers the message with an error reply rather than waiting for it anew."""


class StateError(FedcoreError):
    """A LinkState refused an operation."""


class NotFoundError(StateError, LookupError):
    """The thing asked for does not exist (or is not visible to the caller)."""


class RunNotFoundError(NotFoundError):
    """No run with this id."""


class NodeNotFoundError(NotFoundError):
    """No node with this id."""


class MessageNotFoundError(NotFoundError):
    """No message with this id."""


class ConflictError(StateError):
    """An item with the same id but different content is already stored."""


class ReplyRejectedError(StateError):
    """A reply that cannot be accepted: its message expired or was answered by fedcore."""


class RunFinishedError(StateError):
    """The run has finished; it takes no more messages."""


class InvalidTransitionError(StateError):
    """A lifecycle move that the transition table does not allow."""


class ClaimLostError(StateError):
    """A claim's fencing token is stale: the claim expired and the run moved on without it.

    The claimant must stop acting for the run: another exec may have claimed it since.
    """


class NotEnoughNodesError(FedcoreError, TimeoutError):
    """Waiting for a minimum number of nodes ran past its timeout."""


class InconsistentRepliesError(FedcoreError, ValueError):
    """A round's replies that cannot be aggregated together: one lacks its weight, or
    their records disagree (Flower's ``InconsistentMessageReplies``)."""


class AggregationError(FedcoreError, ValueError):
    """A round's aggregate that a server optimizer cannot apply: its arrays differ in
    names or shapes from the model it updates, or from the optimizer's state (Flower's
    ``AggregationError``)."""


class ErrorReplyError(FedcoreError, ValueError):
    """A legacy client call (:mod:`fedcore.legacy.grid_client_proxy`) whose Message was
    answered by an error: the ClientApp raised, the node left, the TTL ran out. A
    ``ValueError``, as Flower's proxy raises; the legacy server counts it as a failure."""


class RefusedReplyError(FedcoreError, ValueError):
    """A training reply a strategy refuses to aggregate (:mod:`fedcore.strategy.replies`):
    arrays unlike those sent, non-finite values, or a weight that is no count. ``label``
    is how the round's summary counts it: ``"refused: non-finite"`` and so on."""

    def __init__(self, label: str, reason: str) -> None:
        super().__init__(reason)
        self.label = f"refused: {label}"


class MessageInitializationError(FedcoreError, TypeError):
    """``Message(...)`` called with arguments that fit none of its forms: a wrong type,
    a missing or extra argument, content and an error together, or routing arguments
    given to a reply. Flower's name, and a ``TypeError`` as Flower's is; a valid form
    with a bad value (an unknown message type, a ttl that is not positive) is a
    ``ValueError``."""


class ResourceError(FedcoreError):
    """The machine has no room for what was asked: shared memory or disk is full.

    Not the peer's fault and not a bug: the message says which resource and how
    much was needed, so an operator can give the process more.
    """


class LinkUnavailableError(FedcoreError, ConnectionError):
    """The link cannot be reached now: nothing listens, the connection broke, or it shuts down.

    The one failure of a fleet call that a node retries (with backoff): everything
    else the link answers is final for that request.
    """


class LinkBusyError(LinkUnavailableError):
    """The link refused the call for now: its caller is over the link's request rate.

    A fleet call answered RESOURCE_EXHAUSTED. The rate is kept per IP address (and
    per node key, and for registrations in all), so a stranger behind the same NAT
    can spend a node's share: for the node this is the link being away for a while,
    retried with backoff like any outage, never a reason to stop. The link refuses
    before it acts on the request, so sending the same call again is safe.
    ``retry_after``: the seconds the link said to wait at least (0.0: it did not
    say); the link raises it with the hint, the node's client with the hint it read.
    """

    def __init__(self, message: str, *, retry_after: float = 0.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ClusterUnavailableError(FedcoreError, ConnectionError):
    """The Ray cluster a simulation's ``ray`` backend was pointed at does not answer.

    Nothing listens at the address, or what listens did not let Ray connect within
    its deadline. The message names the address: a silent hang in ``ray.init`` is
    the failure this replaces. Not a UsageError: the address may be right and the
    cluster still starting.
    """


def first_error(group: BaseExceptionGroup[E]) -> E:
    """The first exception in ``group``, however deeply nested.

    A task group wraps what its tasks raised; a role that reports one error to a
    person reports the first of them.
    """
    found: E | BaseExceptionGroup[E] = group
    while isinstance(found, BaseExceptionGroup):
        found = found.exceptions[0]
    return found
