"""A fake OpenAI-compatible completions server for the benchmark harness's tests: ``/v1/models``,
``/v1/completions`` (streamed or not, ``token_ids`` in each choice), ``/health`` and a ``/metrics`` page whose
counters move with the requests served (vLLM's speculative counters: every request drafts ``max_tokens // 2`` times
and has one draft token of three accepted each time, so the mean acceptance length is 2.0; its TTFT histogram; the
cluster's chosen-k histogram, branch and prefix counters). No vLLM, no Ray: a thread of this process, or
``python -m tests.benchmarks.fake_server PORT`` as a server process of its own."""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "fake-model"


class State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = self.drafts = self.tokens = 0
        self.ttft_sum = 0.0
        self.ttft_count = 0


def metrics_page(s: State) -> str:
    return "\n".join([
        "# TYPE vllm:spec_decode_num_drafts_total counter",
        f'vllm:spec_decode_num_drafts_total{{model_name="{MODEL}"}} {s.drafts}',
        f'vllm:spec_decode_num_draft_tokens_total{{model_name="{MODEL}"}} {3 * s.drafts}',
        f'vllm:spec_decode_num_accepted_tokens_total{{model_name="{MODEL}"}} {s.drafts}',
        f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="{MODEL}",position="0"}} {s.drafts}',
        f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="{MODEL}",position="1"}} 0',
        "# TYPE vllm:time_to_first_token_seconds histogram",
        f'vllm:time_to_first_token_seconds_sum{{model_name="{MODEL}"}} {s.ttft_sum}',
        f'vllm:time_to_first_token_seconds_count{{model_name="{MODEL}"}} {s.ttft_count}',
        # the cluster's: every request is one step at k = 3
        'eagle_cluster_speculative_tokens_bucket{le="0.0"} 0',
        f'eagle_cluster_speculative_tokens_bucket{{le="3.0"}} {s.requests}',
        f'eagle_cluster_speculative_tokens_bucket{{le="+Inf"}} {s.requests}',
        f"eagle_cluster_branch_lookups_total {2 * s.requests}",
        f"eagle_cluster_branch_hits_total {s.requests}",
        f"eagle_cluster_draft_prefix_hit_tokens {10 * s.requests}",
        f"eagle_cluster_draft_prefix_miss_tokens {s.requests}",
    ]) + "\n"


def handler(state: State, token_delay_s: float) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def reply(self, status: int, body: bytes, kind: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/health":
                self.reply(200, b"")
            elif self.path == "/v1/models":
                self.reply(200, json.dumps({"object": "list", "data": [
                    {"id": MODEL, "object": "model", "created": 0, "owned_by": "test"}]}).encode())
            elif self.path == "/metrics":
                with state.lock:
                    page = metrics_page(state)
                self.reply(200, page.encode(), "text/plain")
            else:
                self.reply(404, b"{}")

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            n = int(body.get("max_tokens") or 16)
            prompt = body.get("prompt", "")
            ids = [(len(prompt) + i) % 100 for i in range(n)]  # the same prompt: the same tokens
            start = time.perf_counter()
            base = {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": MODEL}
            usage = {"prompt_tokens": len(prompt.split()) + 1, "completion_tokens": n,
                     "total_tokens": len(prompt.split()) + 1 + n}
            if not body.get("stream"):
                time.sleep(token_delay_s * n)
                self.count(n, time.perf_counter() - start)
                self.reply(200, json.dumps({**base, "choices": [
                    {"index": 0, "text": "x" * n, "finish_reason": "length", "logprobs": None, "token_ids": ids}],
                    "usage": usage}).encode())
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            ttft = 0.0
            for i in range(n):
                time.sleep(token_delay_s)
                ttft = ttft or time.perf_counter() - start
                chunk = {**base, "choices": [{"index": 0, "text": "x", "finish_reason": None, "logprobs": None,
                                              "token_ids": [ids[i]]}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(f"data: {json.dumps({**base, 'choices': [], 'usage': usage})}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True
            self.count(n, ttft)

        def count(self, n: int, ttft: float) -> None:
            with state.lock:
                state.requests += 1
                state.drafts += n // 2
                state.tokens += n
                state.ttft_sum += ttft
                state.ttft_count += 1

    return Handler


class FakeServer:
    """``with FakeServer() as s:`` serves on ``s.base`` from a thread until the block ends."""

    def __init__(self, port: int = 0, token_delay_s: float = 0.0005) -> None:
        self.state = State()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), handler(self.state, token_delay_s))
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FakeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


if __name__ == "__main__":
    FakeServer(int(sys.argv[1])).httpd.serve_forever()
