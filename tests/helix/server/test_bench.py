"""``helix bench`` against real HTTP servers: the in-process serving stack (uvicorn, coordinator,
three workers) and a plain standard-library server that answers errors."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from helix.cli import main
from helix.loadgen import BenchConfig, run_bench
from helix.sim.workload import TraceRequest

from tests.builders.stack import MODEL_NAME, local_stack

VOCAB = 300   # the tiny demo checkpoint's vocabulary


@pytest.fixture(scope="module")
def stack(tiny_model):
    with local_stack(tiny_model[0]) as s:
        yield s


def test_every_request_counted_once_with_the_servers_token_counts(stack, tmp_path, capsys):
    before = stack.generated_tokens()
    out = tmp_path / "bench.json"
    rc = main(["bench", stack.url, "--input-len", "9", "--output-len", "7", "--num-requests", "6",
               "--rate", "50", "--vocab-size", str(VOCAB), "--json", str(out)])
    assert rc == 0
    d = json.loads(out.read_text())
    assert d["model"] == MODEL_NAME
    assert d["requests_arrived"] == d["requests_completed"] == 6
    assert d["requests_failed"] == d["requests_unfinished"] == 0 and d["errors"] == {}
    # Exact lengths: 9 prompt ids in, 7 tokens out (ignore_eos), and the server counted the same.
    assert d["tokens_generated"] == 6 * 7 == stack.generated_tokens() - before
    assert d["prompt_tokens"] == 6 * 9
    assert d["ttft"]["count"] == 6 and d["request_decode_latency"]["count"] == 6
    assert d["inter_token_latency"]["count"] <= 6 * 6
    assert 0 < d["ttft"]["p50_s"] <= d["ttft"]["p90_s"] <= d["ttft"]["p99_s"]
    assert d["decode_throughput_tokens_per_s"] == pytest.approx(42 / d["duration_s"])
    assert "decode tok/s" in capsys.readouterr().out
    stack.wait_kv_free()


def test_trace_replay_and_continuous_usage(stack, tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                     "2023-11-16 18:15:46.0,5,3\n2023-11-16 18:15:47.0,12,4\n"
                     "2023-11-16 18:15:49.0,3000,4\n2023-11-16 18:15:50.0,8,2\n")
    result = run_bench(BenchConfig(stack.url, vocab_size=VOCAB),
                       (TraceRequest(0.0, 5, 3), TraceRequest(0.01, 12, 4), TraceRequest(0.02, 8, 2)))
    assert result.requests_completed == 3 and result.tokens_generated == 9
    assert result.prompt_tokens == 25
    # The CLI path: --max-prompt drops the 3000-token row, the rest replays at the trace's gaps.
    out = tmp_path / "r.json"
    assert main(["bench", stack.url, "--trace", str(trace), "--rate", "20", "--max-prompt", "64",
                 "--vocab-size", str(VOCAB), "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["requests_planned"] == d["requests_completed"] == 3 and d["tokens_generated"] == 9
    stack.wait_kv_free()


def test_rate_and_duration_set_the_number_of_requests(stack, tmp_path):
    # No --num-requests: as many as 4 req/s brings in 2 s; constant arrivals at 0, 0.25, ..., 1.75 s.
    out = tmp_path / "r.json"
    assert main(["bench", stack.url, "--input-len", "4", "--output-len", "3", "--rate", "4",
                 "--arrivals", "constant", "--duration", "2", "--vocab-size", str(VOCAB),
                 "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["requests_planned"] == d["requests_arrived"] == 8
    assert d["requests_completed"] + d["requests_unfinished"] == 8
    stack.wait_kv_free()


def test_endpoint_errors_fail_loudly(stack, tmp_path, capsys):
    # A real 400 from the server for each request (prompt ids outside the vocabulary) and a 404 (a
    # model the server does not serve): counted, reported with the server's message, exit status 1.
    out = tmp_path / "r.json"
    rc = main(["bench", stack.url, "--input-len", "4", "--output-len", "2", "--num-requests", "3",
               "--vocab-size", "100000", "--seed", "1", "--json", str(out)])
    assert rc == 1
    d = json.loads(out.read_text())
    assert d["requests_failed"] == 3 and d["errors"] == {"HTTP 400": 3}
    assert "vocabulary" in d["error_examples"]["HTTP 400"]
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: 3 of 3 requests failed: HTTP 400 x3")
    rc = main(["bench", stack.url, "--model", "nope", "--input-len", "4", "--output-len", "2",
               "--num-requests", "2", "--vocab-size", str(VOCAB)])
    assert rc == 1
    assert "HTTP 404 x2" in capsys.readouterr().err


def test_duration_bounds_the_run_and_cancels_requests_in_flight(stack):
    # 40 requests of 64 tokens cannot finish in 1.5 s on the tiny CPU stack: the run stops at the
    # deadline, and the cancelled requests free their KV on every worker.
    work = tuple(TraceRequest(0.01 * i, 8, 64) for i in range(40))
    result = run_bench(BenchConfig(stack.url, vocab_size=VOCAB, duration_s=1.5), work)
    assert result.duration_s == pytest.approx(1.5, abs=0.3)
    assert result.requests_unfinished > 0 and result.requests_failed == 0
    assert result.requests_completed + result.requests_unfinished == result.requests_arrived
    assert result.tokens_generated > 0
    stack.wait_kv_free()


class _Failing(BaseHTTPRequestHandler):
    """Lists one model; every completion is a 500 with an OpenAI-style error body."""

    def do_GET(self):
        self._reply(200, {"object": "list", "data": [{"id": "m", "object": "model"}]})

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self._reply(500, {"error": {"message": "out of cheese", "type": "server_error"}})

    def _reply(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_failing_server_and_nothing_listening(capsys):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        rc = main(["bench", url, "--input-len", "3", "--output-len", "2", "--num-requests", "4"])
        assert rc == 1
        assert "error: 4 of 4 requests failed: HTTP 500 x4 (out of cheese)" in capsys.readouterr().err
    finally:
        server.shutdown()
        server.server_close()
    with socket.socket() as s:   # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc = main(["bench", f"http://127.0.0.1:{port}", "--input-len", "3", "--output-len", "2"])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: cannot reach http://127.0.0.1:{port}") and len(err.splitlines()) == 1
