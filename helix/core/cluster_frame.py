"""The words of the live view's frame (``helix.cluster/1``): what ``GET /v1/cluster`` serves and
what a simulated run's replay holds, one frame per moment. The frame's builders live where the
figures are (``helix.server.live``, the simulator); its checker and the page that draws it in
:mod:`planner.live_view`."""

from __future__ import annotations

SCHEMA = "helix.cluster/1"

NODE_STATES = ("serving", "suspect", "dead", "draining", "joining", "lost")
"""A node's state in a frame: ``serving`` (takes requests), ``suspect`` (stopped answering for a
short while), ``dead`` (no answer past the health limit), ``draining`` (takes no new requests; an
emptied one too), ``joining`` (registered, not placed yet), ``lost`` (dead, and its worker cannot be
restarted)."""

EVENT_KINDS = ("replan", "failure", "return", "restart", "lost", "drain", "join")
"""What an event in a frame's timeline says happened: ``return``, a failed node serves again (live
and simulated alike); ``restart``, a new worker process registered for a plan node."""

WINDOW_S = 60.0
"""The frame's cluster figures (request rate, latency percentiles) are over this many seconds."""

EVENTS_KEEP_S = 3600.0
"""A frame's events reach back this far."""
