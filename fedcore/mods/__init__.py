"""Mods: middleware for a ClientApp, ``ClientApp(mods=[...])``.

A mod is a plain ``def mod(msg, context, call_next) -> Message`` that may look at or
change the message on its way to the handler and the reply on its way back (see
:mod:`fedcore.apps.client_app`). These are the ones fedcore ships:

- :func:`fixedclipping_mod` — the node's half of central differential privacy with
  client-side fixed clipping;
- :func:`adaptiveclipping_mod` — the same for adaptive clipping: clips, and reports
  whether it did;
- :class:`LocalDpMod` — local differential privacy: the node clips its update and
  adds Gaussian noise before the reply leaves it;
- :func:`message_stats_mod` — message sizes and handler time, in the reply's metrics;
- :func:`message_size_mod`, :func:`arrays_size_mod` — message and array sizes, logged.

The types to write one with are here too: :data:`Mod`, and :data:`CallNext` (Flower
calls it ``ClientAppCallable``; both names are given).
"""

from fedcore.apps.client_app import CallNext, ClientAppCallable, Mod
from fedcore.mods.clipping import adaptiveclipping_mod, fixedclipping_mod
from fedcore.mods.local_dp import LocalDpMod
from fedcore.mods.sizes import arrays_size_mod, message_size_mod
from fedcore.mods.stats import message_stats_mod

__all__ = [
    "CallNext",
    "ClientAppCallable",
    "LocalDpMod",
    "Mod",
    "adaptiveclipping_mod",
    "arrays_size_mod",
    "fixedclipping_mod",
    "message_size_mod",
    "message_stats_mod",
]
