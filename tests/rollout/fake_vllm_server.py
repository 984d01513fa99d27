#!/usr/bin/env python3
"""Stands in for a vLLM virtualenv's python in tests: ``fake_vllm_server.py -m vllm... ARGS``.

Writes its command line (JSON) to ``$FAKE_VLLM_RECORD`` and serves ``/health`` and
``/v1/completions`` on ``--host``/``--port`` over real HTTP, appending each request body to the
record file (one JSON line each). The answer has the fields vLLM returns with
``return_token_ids`` and ``logprobs``: one token per choice.

With ``--enable-lora`` it also serves vLLM's runtime adapter routes as vLLM does (only when
``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` is set): ``/v1/load_lora_adapter`` (400 unless the folder
holds ``adapter_config.json`` and ``adapter_model.safetensors``, or the name is taken),
``/v1/unload_lora_adapter`` (404 for a name not loaded), and completions for a ``model`` that is
neither the served model nor a loaded adapter are answered 404.
"""

from __future__ import annotations

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

RECORD = os.environ["FAKE_VLLM_RECORD"]


def _arg(name: str) -> str:
    return sys.argv[sys.argv.index(name) + 1]


LORA = "--enable-lora" in sys.argv and os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING")
LOADED: set[str] = set()


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:  # quiet
        pass

    def _text(self, code: int, text: str) -> None:
        data = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _lora(self, body: dict) -> None:
        name = body.get("lora_name")
        if self.path == "/v1/load_lora_adapter":
            folder = body.get("lora_path", "")
            files = ("adapter_config.json", "adapter_model.safetensors")
            if name in LOADED or not all(os.path.isfile(os.path.join(folder, f)) for f in files):
                return self._text(400, f"cannot load {name!r} from {folder!r}")
            LOADED.add(name)
            return self._text(200, f"Success: LoRA adapter '{name}' added successfully.")
        if name not in LOADED:
            return self._text(404, f"The lora adapter '{name}' cannot be found.")
        LOADED.discard(name)
        return self._text(200, f"Success: LoRA adapter '{name}' removed successfully.")

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._send(200 if self.path == "/health" else 404, {})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with open(RECORD, "a") as fh:
            fh.write(json.dumps({"path": self.path, "body": body}) + "\n")
        if LORA and self.path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
            return self._lora(body)
        if self.path == "/v1/completions" and body.get("model") not in {
            _arg("--served-model-name"),
            *LOADED,
        }:
            return self._send(404, {"error": f"model {body.get('model')!r} does not exist"})
        choices = [
            {"index": i, "text": "1", "token_ids": [5], "finish_reason": "length",
             "logprobs": {"token_logprobs": [-0.5], "tokens": ["1"]}}
            for i in range(body.get("n", 1))
        ]  # fmt: skip
        self._send(200, {"choices": choices})


if __name__ == "__main__":
    with open(RECORD, "w") as fh:
        env = {
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING")
        }
        fh.write(json.dumps({"argv": sys.argv[1:], "env": env}) + "\n")
    ThreadingHTTPServer((_arg("--host"), int(_arg("--port"))), Handler).serve_forever()
