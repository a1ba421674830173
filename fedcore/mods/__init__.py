"""Mods: middleware for a ClientApp, ``ClientApp(mods=[...])``.

A mod is a plain ``def mod(msg, context, call_next) -> Message`` that may look at or
change the message on its way to the handler and the reply on its way back (see
:mod:`fedcore.apps.client_app`). These are the ones fedcore ships:

- :func:`fixedclipping_mod` — the node's half of central differential privacy with
  client-side fixed clipping;
- :func:`message_stats_mod` — message sizes and handler time, in the reply's metrics.

The types to write one with are here too: :data:`Mod`, and :data:`CallNext` (Flower
calls it ``ClientAppCallable``; both names are given).
"""

from fedcore.apps.client_app import CallNext, ClientAppCallable, Mod
from fedcore.mods.clipping import fixedclipping_mod
from fedcore.mods.stats import message_stats_mod

__all__ = ["CallNext", "ClientAppCallable", "Mod", "fixedclipping_mod", "message_stats_mod"]
