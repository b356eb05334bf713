"""Everything ``helix serve`` runs, assembled in order and torn down in reverse.

1. the coordinator's gRPC service (worker registration, native client API);
2. one worker per plan node: Ray actors (:mod:`helix.server.launcher`), and/or external workers that
   register over gRPC (``helix worker``); nodes that register later join (:mod:`helix.server.elastic`);
   Ray workers that die are started again, and those that cannot be are reported lost
   (:mod:`helix.server.restarts`);
3. the live coordinator: configure slices and peers (a worker that cannot load its slice stops
   everything with the node's name and the reason), build the scheduler;
4. the OpenAI-compatible HTTP app.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from coordinator.grpc_api import CLIENT_METHODS, CoordinatorService, Registry
from helix.server.launcher import LaunchConfig, RayLauncher
from coordinator.runtime import Coordinator, RuntimeConfig
from coordinator.workers import check_serving
from coordinator.chat_template import ChatTemplate
from coordinator.textcodec import TextCodec
from helix.core.errors import HelixUserError
from helix.core.gguf import checkpoint_folder
from helix.core.models import ModelSpec
from helix.core.plan import Plan
from helix.core.spec import ClusterSpec
from helix.server.admin import add_join_routes
from helix.server.app import create_app
from helix.server.elastic import Elastic, ObservedMix, RayJoins
from helix.server.guard import HttpOptions
from helix.server.metrics import ServingMetrics
from helix.server.restarts import Supervisor
from helix.net.control import ControlServer, start_server
from helix.net.keys import ClusterKeys

log = logging.getLogger("helix.serve")


@dataclass(frozen=True)
class ServeOptions:
    """What ``helix serve`` was asked for."""

    host: str = "127.0.0.1"
    grpc_port: int = 0
    """Coordinator gRPC port (native client, ``helix worker`` registration); 0 = any free port."""
    model_name: str | None = None
    """Name in ``/v1/models`` and the ``model`` field of requests (default: the checkpoint folder name)."""
    external_nodes: tuple[str, ...] = ()
    """Plan nodes served by ``helix worker`` processes instead of Ray actors."""
    register_timeout_s: float = 300.0
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    http: HttpOptions = field(default_factory=HttpOptions)
    """API key and request-body limits of the OpenAI API."""
    cluster: ClusterSpec | None = None
    """The cluster spec (``--cluster``): nodes the plan lacks that register while serving are
    checked against it and placed by a re-plan (:mod:`helix.server.elastic`); None: refused."""
    replan_poll_s: float | None = 30.0
    """With ``cluster``: how often the re-plan trigger is asked whether the workload's mix drifted
    enough to re-plan (``planner.trigger``; None: only joins re-plan)."""
    keys: ClusterKeys | None = None
    """The cluster's keys (``--keys DIR``): CURVE on the data plane, TLS and the cluster token on
    the control plane (worker calls and registration), handed to the Ray workers; None: plain."""
    chat_template: ChatTemplate | None = None
    """The chat template that replaces the checkpoint's (``--chat-template``); None: the
    checkpoint's own, and without one chat requests are refused (:mod:`coordinator.chat_template`)."""


def check_model_matches_plan(plan: Plan, model_path: str) -> ModelSpec:
    """The model's shape, read from ``model_path`` (a checkpoint folder, a GGUF file or a folder
    holding one); one clear error when there is none or its layers are not the plan's."""
    if not Path(model_path).exists():
        raise HelixUserError(f"--model {model_path!r}: no such checkpoint folder or GGUF file")
    spec = ModelSpec.from_pretrained_dir(checkpoint_folder(model_path))
    if spec.num_layers != plan.num_layers:
        raise HelixUserError(f"the plan places {plan.num_layers} layers but {model_path!r} has "
                             f"{spec.num_layers}")
    return spec


def _served_name(model_path: Path) -> str:
    """The folder's name, or a GGUF file's without ``.gguf``."""
    path = model_path.resolve()
    return path.stem if path.is_file() and path.suffix.lower() == ".gguf" else path.name


class ServeStack:
    """Start with :meth:`start`; stop with :meth:`close` (always safe to call)."""

    def __init__(self, plan: Plan, model_path: str, options: ServeOptions = ServeOptions(),
                 progress=None) -> None:
        """``progress(line)`` hears each step of the start (default: the log)."""
        check_model_matches_plan(plan, model_path)
        check_serving(plan)   # before any worker starts
        unknown = set(options.external_nodes) - {p.node for p in plan.placements}
        if unknown:
            raise HelixUserError(f"--external node(s) {sorted(unknown)} are not in the plan")
        self.plan = plan
        self.model_path = str(model_path)
        """As given: each worker resolves it on its own machine (a GGUF to its converted folder)."""
        self.options = options
        self.model_name = options.model_name or _served_name(Path(model_path))
        self.metrics = ServingMetrics(self.model_name)
        self.registry = Registry()
        self.service = CoordinatorService(self.registry, self.model_name, options.http.api_key,
                                          admin_open=options.http.admin_open)
        self.progress = progress or log.info
        self.launcher = RayLauncher(options.launch, self.progress)
        self.grpc: ControlServer | None = None
        self.coordinator: Coordinator | None = None
        self.elastic: Elastic | None = None
        self.ray_joins: RayJoins | None = None
        self.supervisor: Supervisor | None = None
        self.app = None

    def start(self) -> "ServeStack":
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        # Generate and Info are the client API: --api-key guards them, as it guards HTTP.
        self.grpc = start_server([self.service.handler()], self.options.host, self.options.grpc_port,
                                 keys=self.options.keys, open_methods=CLIENT_METHODS)
        # Fails fast on a checkpoint without a tokenizer (a GGUF: its converted folder's), or with
        # a template that does not parse.
        codec = TextCodec(checkpoint_folder(self.model_path), self.options.chat_template)
        self.progress(f"chat template: {codec.chat_template_line()}")
        if self.options.runtime.max_model_len is not None:   # and on a cap it cannot serve
            codec.cap_context(self.options.runtime.max_model_len)
        ray_nodes = [p.node for p in self.plan.placements if p.node not in self.options.external_nodes]
        handles = (self.launcher.start(ray_nodes, self.model_path, self.grpc.address, self.options.keys)
                   if ray_nodes else [])
        if self.options.external_nodes:
            log.info("waiting for external workers %s to register at %s", self.options.external_nodes,
                     self.grpc.address)
            handles += self.registry.wait(self.options.external_nodes, self.options.register_timeout_s)
        self.coordinator = Coordinator(self.plan, self.model_path, self.options.runtime, codec,
                                       self.options.host, observer=self.metrics, keys=self.options.keys)
        self.progress(f"loading each worker's slice of {Path(self.model_path).name} ...")
        self.coordinator.attach(handles)
        self.elastic = Elastic(self.coordinator, self.options.cluster)
        self.service.on_join = self.elastic.join
        if self.options.cluster is not None and self.options.replan_poll_s is not None:
            self.coordinator.observer = ObservedMix(self.metrics, self.elastic)   # the mix's drift
            self.elastic.watch(self.options.replan_poll_s)
        if ray_nodes:   # dead Ray workers start again; those that cannot are lost
            self.supervisor = Supervisor(self.launcher, self.launcher.config.restarts,
                                         on_lost=self._node_lost, on_back=self.elastic.node_back)
        if ray_nodes and self.options.cluster is not None:   # Ray nodes that appear later join
            self.ray_joins = RayJoins(self.elastic, self.launcher, self.model_path, self.grpc.address,
                                      self.options.keys)
        self.service.coordinator = self.coordinator
        self.app = create_app(self.coordinator, self.model_name, self.metrics, self.options.http,
                              cluster=self.options.cluster, elastic=self.elastic)
        add_join_routes(self.app, self.elastic)

    def _node_lost(self, node: str, reason: str) -> None:
        """A node whose worker cannot be restarted: reported lost, and gone to the re-plan trigger."""
        self.coordinator.mark_lost(node, reason)
        self.elastic.node_lost(node)

    @property
    def grpc_address(self) -> str:
        return self.grpc.address

    def close(self) -> None:
        if self.supervisor is not None:
            self.supervisor.close()
            self.supervisor = None
        if self.ray_joins is not None:
            self.ray_joins.close()
            self.ray_joins = None
        if self.elastic is not None:
            self.elastic.close()
        if self.coordinator is not None:
            self.coordinator.close(shutdown_workers=True)
            self.coordinator = None
        self.launcher.shutdown()
        if self.grpc is not None:
            self.grpc.stop()
            self.grpc = None
