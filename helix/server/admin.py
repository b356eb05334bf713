"""Admin routes of the HTTP API: draining nodes and applying a new plan (:mod:`coordinator.drain`,
:mod:`coordinator.reshape`).

- ``GET /admin/nodes``: ``{"nodes": [status, ...]}``, one per plan node (state ``ok`` / ``suspect`` /
  ``dead`` / ``draining`` / ``drained``, its layers, the requests left on it);
- ``GET /admin/nodes/{node}``: one node's status;
- ``POST /admin/drain`` ``{"node", "force": false, "move": false}``: out of routing now; its
  requests finish where they are (``move``: start again elsewhere); the node's status after it;
- ``POST /admin/undrain`` ``{"node"}``: back into routing;
- ``GET /admin/joins`` (``helix serve`` only): nodes that registered to join and their state;
- ``GET /admin/plan``: the running plan (what ``helix plan NEW --from`` takes as the running one);
- ``POST /admin/plan`` ``{"plan": {...}, "timeout_s": 600}``: apply a new plan live, drain-first
  per node (:mod:`coordinator.reshape`); answers when it is done, with each node's change. A plan
  that does not fit (other model, a node without a worker) is 400, one being applied already 409.

``--api-key`` guards them as it guards ``/v1`` (:mod:`helix.server.guard`). An unknown node is 404,
a drain that would leave some layer unserved 409 (``force`` drains anyway), a bad body 400. The
routes are plain functions: FastAPI runs them off the event loop (a drain calls the worker).
"""

from __future__ import annotations

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr
from starlette.exceptions import HTTPException

from coordinator.drain import ADMIN_NEEDS_KEY, DrainRefused, UnknownNode
from coordinator.reshape import ApplyBusy
from helix.core.errors import HelixUserError
from helix.core.plan import Plan


class DrainRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    node: StrictStr
    force: StrictBool = False
    """Drain even the last node that keeps some layer served (new requests then wait, then 503)."""
    move: StrictBool = False
    """Move the node's requests to other pipelines (prefilled again) instead of letting them finish."""


class UndrainRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    node: StrictStr


class ApplyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    plan: dict
    """The new plan, as ``helix plan -o`` writes it (the YAML's mapping)."""
    timeout_s: float = Field(600.0, gt=0)
    """Longest wait for one node's requests to finish before its slice moves."""


def _call(action):
    try:
        return action()
    except UnknownNode as exc:
        raise HTTPException(404, str(exc)) from None
    except (DrainRefused, ApplyBusy) as exc:
        raise HTTPException(409, str(exc)) from None
    except HelixUserError as exc:
        raise HTTPException(400, str(exc)) from None


def add_join_routes(app: FastAPI, elastic) -> None:
    """``GET /admin/joins``: every node that registered to join while serving and where it stands
    (``planning`` / ``applying`` / ``serving`` / ``idle`` (the re-plan kept the running placement)
    / ``failed``, with why), from ``elastic`` (:class:`helix.server.elastic.Elastic`)."""
    @app.get("/admin/joins")
    def joins():
        return {"joins": [{"node": j.node, "state": j.state, "detail": j.detail}
                          for j in list(elastic.joins.values())]}


def add_admin_routes(app: FastAPI, coordinator, admin_open: bool = True) -> None:
    """Add the routes to ``app`` for ``coordinator`` (a :class:`~coordinator.runtime.Coordinator`).
    ``admin_open`` False (no API key, off loopback: :class:`~helix.server.guard.HttpOptions`):
    drain and undrain answer 403."""

    def changes_allowed() -> None:
        if not admin_open:
            raise HTTPException(403, ADMIN_NEEDS_KEY)

    @app.get("/admin/nodes")
    def nodes():
        return {"nodes": [s.to_dict() for s in coordinator.nodes_status()]}

    @app.get("/admin/nodes/{node}")
    def node(node: str):
        return _call(lambda: coordinator.node_status(node).to_dict())

    @app.post("/admin/drain")
    def drain(body: DrainRequest):
        changes_allowed()
        return _call(lambda: coordinator.drain(body.node, force=body.force, move=body.move).to_dict())

    @app.post("/admin/undrain")
    def undrain(body: UndrainRequest):
        changes_allowed()
        return _call(lambda: coordinator.undrain(body.node).to_dict())

    @app.get("/admin/plan")
    def plan():
        return coordinator.plan.to_dict()

    @app.post("/admin/plan")
    def apply_plan(body: ApplyRequest):
        changes_allowed()
        return _call(lambda: coordinator.apply_plan(Plan.from_dict(body.plan, "the new plan"),
                                                    timeout_s=body.timeout_s).to_dict())
