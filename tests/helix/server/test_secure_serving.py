"""The serving stack with a cluster's keys, in this process (real ZeroMQ CURVE, real gRPC TLS): a
two-worker pipeline still answers exactly as ``transformers`` does, and a peer without the keys
can neither inject work on the data plane nor reconfigure a worker nor register one."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import grpc
import pytest
import zmq

from coordinator.grpc_api import CLIENT_METHODS, CoordinatorService, Registry
from coordinator.runtime import Coordinator, RuntimeConfig, WorkerHandle
from helix.client import Client, ClientError
from helix.net.control import (COORDINATOR_SERVICE, WORKER_SERVICE, ControlClient, ControlError,
                               start_server, tls_channel_options)
from helix.net.data_plane import DataPlane
from helix.net.io_types import NewRequest, StageInput
from helix.net.keys import ClusterKeys, generate
from helix.net.sampling import SamplingParams
from helix.net.wire import Hop, InputBatch, Route, WireInput, encode
from worker.server import WorkerServer

from tests.builders.serving import PROMPTS, hf_greedy, two_stage_plan

pytestmark = [pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def secured(tiny_model, tmp_path_factory):
    ckpt, _ = tiny_model
    folder = tmp_path_factory.mktemp("keys") / "k"
    generate(folder)
    keys = ClusterKeys.load(folder)
    plan = two_stage_plan()
    servers = [WorkerServer(p.node, str(ckpt), torch_threads=1, keys=keys) for p in plan.placements]
    coord = grpc_server = None
    try:
        coord = Coordinator(plan, str(ckpt), RuntimeConfig(stats_interval_s=0.2), keys=keys)
        coord.attach([WorkerHandle(s.node, s.control.address, s.data.address) for s in servers])
        service = CoordinatorService(Registry(), "tiny")
        service.coordinator = coord
        grpc_server = start_server([service.handler()], keys=keys, open_methods=CLIENT_METHODS)
        yield keys, coord, servers, service, grpc_server, folder
    finally:
        if grpc_server is not None:
            grpc_server.stop()
        if coord is not None:
            coord.close()
        for s in servers:
            s.shutdown()


def test_greedy_tokens_equal_transformers_through_two_secured_workers(secured, tiny_model):
    keys, coord, _, _, grpc_server, folder = secured
    _, model = tiny_model
    for i in (0, 2, 5):
        ids = coord.codec.encode(PROMPTS[i])
        with Client(grpc_server.address, tls_cert=folder / "grpc.crt") as c:
            out = c.generate(ids, temperature=0, max_tokens=8)
            async_out = asyncio.run(_agenerate(c, ids))
        assert list(out.token_ids) == hf_greedy(model, ids, 8), PROMPTS[i]
        assert async_out.token_ids == out.token_ids
    assert set(coord.pipeline_counts) == {("cpu-0", "cpu-1")}
    with Client(grpc_server.address) as plain, pytest.raises(ClientError) as refused:
        plain.generate(ids, max_tokens=2)   # the client API speaks TLS only
    assert refused.value.code == "UNAVAILABLE"


async def _agenerate(client, ids):
    try:
        return await client.agenerate(ids, temperature=0, max_tokens=8)
    finally:
        await client.aclose()


def _injected_request(coord) -> list:
    """A well-formed new request for cpu-0 (id far from the coordinator's own)."""
    ids = tuple(coord.codec.encode(PROMPTS[1]))
    new = NewRequest(10**6, len(ids), SamplingParams(temperature=0, max_tokens=2), ids, enter_layer=0)
    route = Route((Hop("cpu-0", 0), Hop("cpu-1", 4)))
    return encode(InputBatch((WireInput(StageInput(10**6, 0, token_ids=ids, new_request=new), route),)))


def test_a_stranger_cannot_inject_work_on_the_data_plane(secured, tmp_path):
    keys, coord, servers, _, _, _ = secured
    first = servers[0]
    before = first.stats()
    generate(tmp_path / "other")
    other = ClusterKeys.load(tmp_path / "other")
    raw = zmq.Context.instance().socket(zmq.PUSH)   # no CURVE at all
    raw.setsockopt(zmq.SNDTIMEO, 2000)   # a refused handshake leaves PUSH no peer: send would block
    raw.connect(first.data.address)
    try:
        raw.send_multipart(_injected_request(coord))
    except zmq.Again:
        pass   # refused before it could even queue the message: nothing got through
    forged = DataPlane(keys=dataclasses.replace(   # CURVE, the right server key, not a member's key
        keys, curve_client_public=other.curve_client_public, curve_client_secret=other.curve_client_secret))
    forged.set_peers({"cpu-0": first.data.address})
    forged.send_frames("cpu-0", _injected_request(coord))
    try:
        deadline = time.monotonic() + 10
        while first.data._gate.refused < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert first.data._gate.refused >= 2
        time.sleep(1.0)
        after = first.stats()
        assert (after.steps_total, after.num_requests, after.kv_blocks_used) == \
            (before.steps_total, before.num_requests, before.kv_blocks_used)
    finally:
        raw.close(linger=0)
        forged.close()
    # The same message from a cluster member is work (so the check above could have failed).
    member = DataPlane(keys=keys)
    member.set_peers({"cpu-0": first.data.address})
    member.send_frames("cpu-0", _injected_request(coord))
    deadline = time.monotonic() + 20
    while first.stats().steps_total == before.steps_total and time.monotonic() < deadline:
        time.sleep(0.05)
    member.close()
    assert first.stats().steps_total > before.steps_total


def test_a_stranger_cannot_reconfigure_a_worker_or_register_one(secured):
    keys, coord, servers, service, grpc_server, _ = secured
    worker = servers[1]
    with pytest.raises(ControlError) as plain:
        ControlClient(worker.control.address, WORKER_SERVICE, 5).call("Configure", {"start": 0, "end": 8})
    assert plain.value.code == grpc.StatusCode.UNAVAILABLE
    tls, options = tls_channel_options(keys.tls_cert_pem)   # TLS, but no token
    for address, method, body in ((worker.control.address, f"/{WORKER_SERVICE}/Configure",
                                   b'{"start":0,"end":8}'),
                                  (worker.control.address, f"/{WORKER_SERVICE}/Shutdown", b"{}"),
                                  (grpc_server.address, f"/{COORDINATOR_SERVICE}/Register",
                                   b'{"node":"cpu-1","control":"127.0.0.1:1","data":"tcp://127.0.0.1:1"}')):
        with grpc.secure_channel(address, tls, options=options) as channel:
            with pytest.raises(grpc.RpcError) as refused:
                channel.unary_unary(method)(body, timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, method
    stats = ControlClient(worker.control.address, WORKER_SERVICE, keys=keys).call("Stats")
    assert (stats["start"], stats["end"]) == (4, 8) and not worker.wait_stopped(0.1)
    assert coord.workers["cpu-1"].data_address == worker.data.address   # not re-pointed
    assert service.registry._workers == {}
    info = ControlClient(grpc_server.address, COORDINATOR_SERVICE,
                         keys=ClusterKeys(**{**keys.__dict__, "token": "n" * 43})).call("Info")
    assert info["nodes"] == ["cpu-0", "cpu-1"]   # the client API stays open to TLS callers
