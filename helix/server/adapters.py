"""Fine-tuned tasks over HTTP (:mod:`coordinator.adapters`), with vLLM's route names:

- ``POST /v1/load_lora_adapter`` ``{"lora_name", "lora_path"}``: every worker reads its slice's part
  of the task from ``lora_path`` (a PEFT LoRA folder, or Helix's own format for any kind, see
  :mod:`worker.adapter_files`); 200 with a line of text, 400 naming what was wrong (a tensor whose
  shape does not match the base model, a rank over the limit, a missing file, a name in use);
- ``POST /v1/unload_lora_adapter`` ``{"lora_name"}``: new requests for it are refused at once, those
  in flight finish, then every worker drops it; 404 for a task not loaded;
- ``GET /v1/models`` lists the tasks after the base model (``parent`` = the base, ``root`` = the path).

A request names its task in ``model``: the task's name, or ``"<base>:<task>"``; anything else is 404.
``--api-key`` guards these routes as every ``/v1`` route. They are plain functions: FastAPI runs them
off the event loop (a load reads files on every worker; an unload waits for requests).
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict, StrictStr
from starlette.exceptions import HTTPException

from coordinator.adapters import UnknownAdapter


class LoadAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: StrictStr
    lora_path: StrictStr


class UnloadAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: StrictStr
    lora_int_id: int | None = None
    """Accepted for vLLM clients that send it; the name decides."""


def resolve_model(coordinator, base_name: str, model: str) -> str | None:
    """The task ``model`` asks for (None: the base model); HTTP 404 when it names neither the base
    model nor a loaded task."""
    if model == base_name:
        return None
    task = model[len(base_name) + 1:] if model.startswith(base_name + ":") else model
    try:
        coordinator.check_adapter(task)
    except UnknownAdapter as exc:
        raise HTTPException(404, f"model {model!r} not found; this server serves {base_name!r} "
                                 f"and its tasks ({exc})") from None
    return task


def task_cards(coordinator, base_name: str, created: int) -> list[dict]:
    """``/v1/models`` entries of the loaded tasks (those being unloaded are left out)."""
    return [{"id": t.name, "object": "model", "created": created, "owned_by": "helix",
             "root": t.path, "parent": base_name, "kind": t.kind, "bytes": t.nbytes}
            for t in coordinator.adapters() if not t.draining]


#: Why loading or unloading a task is refused without an API key off loopback (HTTP 403).
ADAPTERS_NEED_KEY = ("loading and unloading adapters needs --api-key when helix serve listens off "
                     "loopback (anyone reaching the port could unload a task its users need, or "
                     "have every worker open a path of their choosing)")


def add_adapter_routes(app: FastAPI, coordinator, admin_open: bool = True) -> None:
    """Add the routes to ``app`` for ``coordinator`` (a :class:`~coordinator.runtime.Coordinator`).
    ``admin_open`` False (no API key, off loopback: :class:`~helix.server.guard.HttpOptions`): load
    and unload answer 403, as drain does."""

    def changes_allowed() -> None:
        if not admin_open:
            raise HTTPException(403, ADAPTERS_NEED_KEY)

    @app.post("/v1/load_lora_adapter")
    def load(body: LoadAdapterRequest):
        changes_allowed()
        info = coordinator.load_adapter(body.lora_name, body.lora_path)
        return PlainTextResponse(f"Success: adapter {info.name!r} ({info.kind}, {info.nbytes} bytes) "
                                 f"added successfully.")

    @app.post("/v1/unload_lora_adapter")
    def unload(body: UnloadAdapterRequest):
        changes_allowed()
        try:
            coordinator.unload_adapter(body.lora_name)
        except UnknownAdapter as exc:
            raise HTTPException(404, str(exc)) from None
        return PlainTextResponse(f"Success: adapter {body.lora_name!r} removed successfully.")
