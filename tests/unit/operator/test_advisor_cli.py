"""`llmservice advise`: two scrapes of a real HTTP endpoint serving the stock-vLLM fixture
pages (first the before page, then the after page), exit codes and output formats."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from llmservice.server.cli import main

FIXTURES = Path(__file__).parent / "advisor_fixtures"


@pytest.fixture
def vllm_pod():
    pages = [(FIXTURES / n).read_bytes() for n in ("vllm_block32_before.prom", "vllm_block32_after.prom")]
    served: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            served.append(self.path)
            body = pages[min(len(served), 2) - 1] if self.path == "/metrics" else b"not here"
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", served
    httpd.shutdown()


def test_json_findings_and_exit_code_3(vllm_pod, capsys, tmp_path):
    url, served = vllm_pod
    spec = tmp_path / "svc.yaml"
    spec.write_text("apiVersion: llmservice.dev/v1alpha1\nkind: LLMService\nspec:\n  engine: {maxNumSeqs: 256}\n")
    assert main(["advise", url, "--window", "0.2", "--json", "--spec", str(spec)]) == 3
    findings = json.loads(capsys.readouterr().out)
    assert served == ["/metrics", "/metrics"]
    assert [f["rule"] for f in findings] == ["block-size"]
    assert findings[0]["evidence"]["kvFullWhileBatchSmall"] is True
    assert set(findings[0]) == {"rule", "severity", "summary", "evidence", "recommendation", "expectedEffect"}


def test_text_output(vllm_pod, capsys):
    url, _ = vllm_pod
    assert main(["advise", url + "/metrics", "--window", "0.2"]) == 3
    out = capsys.readouterr().out
    assert out.startswith("[warning] block-size:") and '"blockSize": 16' in out


def test_no_findings_is_exit_0(vllm_pod, capsys, tmp_path):
    url, _ = vllm_pod
    spec = tmp_path / "spec.yaml"
    spec.write_text("engine: {blockSize: 16}\n")  # the fix: a bare spec overrides the page's 32
    assert main(["advise", url, "--window", "0.2", "--json", "--spec", str(spec)]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_unreachable_or_wrong_url_is_exit_1_with_the_reason(vllm_pod, capsys):
    url, _ = vllm_pod
    assert main(["advise", url + "/nope", "--window", "0.1"]) == 1
    assert "HTTP 404" in capsys.readouterr().err


def test_bad_window_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["advise", "http://127.0.0.1:1", "--window", "-1"])
    assert exc.value.code == 2 and "--window -1 must be > 0" in capsys.readouterr().err
