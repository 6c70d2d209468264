"""`llmservice operator render -f FILE`: the manifests the operator would apply, with the
VRAM plan as a comment; a non-zero exit and the cluster's message for what the CRD, the
server or the VRAM check refuses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from llmservice.operator.admission import admit
from llmservice.operator.render import Owner, render
from llmservice.operator.render_cli import main
from llmservice.operator.spec import LLMServiceSpec
from llmservice.operator.template import PLACEHOLDER_UID
from llmservice.operator.vram import check_fit
from llmservice.server.cli_args import configs_from_args, parse_serve_argv

ROOT = Path(__file__).resolve().parents[3]
LLMSERVICE = Path(sys.executable).with_name("llmservice")
SCHEMA = yaml.safe_load((ROOT / "crds/llmservice.yaml").read_text())["spec"]["versions"][0][
    "schema"
]["openAPIV3Schema"]
GPU_8B = {"source": "pvc://weights/llama-3-8b", "catalogName": "llama-3-8b"}


def write(tmp_path: Path, **spec: Any) -> str:
    obj = {
        "apiVersion": "llmservice.dev/v1alpha1",
        "kind": "LLMService",
        "metadata": {"name": "m"},
        "spec": {"model": GPU_8B, "resources": {"gpu": {"memoryGiB": 24}}, **spec},
    }
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(obj))
    return str(path)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_render_prints_what_the_operator_applies_with_the_plan():
    path = ROOT / "examples/smollm2-cpu.yaml"
    done = subprocess.run([str(LLMSERVICE), "operator", "render", "-f", str(path)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    stored, errors = admit(SCHEMA, yaml.safe_load(path.read_text()), None)
    assert errors == []
    spec = LLMServiceSpec.from_dict(stored["spec"])
    expected = render(Owner("smollm2", "default", PLACEHOLDER_UID), spec).all()
    assert [d for d in yaml.safe_load_all(done.stdout)] == expected
    plan = check_fit(spec).plan.as_status()
    comments = [line for line in done.stdout.splitlines() if line.startswith("#")]
    assert "# VRAMFit=True (CPUOnly): no GPU requested" in "\n".join(comments)
    for key, value in plan.items():
        assert f"#   {key}: {value}" in comments, key
    # The contract: the printed pod command is one the server starts.
    (deployment,) = [
        d
        for d in yaml.safe_load_all(done.stdout)
        if d["kind"] == "Deployment" and "llmservice.dev/router" not in d["metadata"]["labels"]
    ]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    engine, _ = configs_from_args(parse_serve_argv(args[1:]))
    assert engine.model == "builtin:smollm2-135m"


def test_render_refuses_what_the_server_cannot_run(capsys, tmp_path):
    spec = {"engine": {"extraArgs": ["--tensor-parallel-size", "16"]}}  # past what it shards over
    code, out, err = run(capsys, "-f", write(tmp_path, **spec))
    assert code == 1 and out == ""
    assert "LLMService m: UnsupportedByEngine: spec.engine.tensorParallelSize 16" in err


def test_render_refuses_what_the_crd_refuses(capsys, tmp_path):
    code, out, err = run(capsys, "-f", write(tmp_path, resources={"gpuMemoryUtilization": 1.0}))
    assert code == 1 and out == ""
    assert "the API server would refuse it" in err
    assert "spec.resources.gpuMemoryUtilization: Invalid value" in err
    assert "gpuMemoryUtilization must lie in [0.5, 0.95]" in err


def test_render_refuses_what_does_not_fit(capsys, tmp_path):
    path = write(tmp_path, model={"source": "pvc://w/llama-70b", "catalogName": "llama-3-70b"})
    code, out, err = run(capsys, "-f", path)
    assert code == 1 and out == ""
    assert "VRAMFit=False (InsufficientVRAM)" in err
    assert "smallest GPU count that fits: 8" in err


def test_the_operator_ceiling_applies_as_in_the_cluster(capsys, tmp_path):
    tight = {"engine": {"maxModelLen": 32768}, "resources": {"gpu": {"memoryGiB": 24},
             "gpuMemoryUtilization": 0.95}}  # fmt: skip
    code, out, _ = run(capsys, "-f", write(tmp_path, **tight))
    assert code == 0 and "#   gpuMemoryUtilization: 0.95" in out
    code, out, err = run(
        capsys, "-f", write(tmp_path, **tight), "--max-gpu-memory-utilization", "0.8"
    )
    assert code == 1 and "x 0.80" in err
    code, out, _ = run(capsys, "-f", write(tmp_path), "--max-gpu-memory-utilization", "0.8")
    assert code == 0 and "- --gpu-memory-utilization\n        - '0.8'" in out


def test_an_hf_model_renders_a_pod_the_server_starts(capsys):
    code, out, err = run(capsys, "-f", str(ROOT / "examples/llama-3-8b.yaml"))
    assert code == 0, err
    (deployment,) = [
        d
        for d in yaml.safe_load_all(out)
        if d["kind"] == "Deployment" and "llmservice.dev/router" not in d["metadata"]["labels"]
    ]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    engine, server = configs_from_args(parse_serve_argv(args[1:]))
    assert engine.model == "hf://meta-llama/Meta-Llama-3-8B-Instruct" and server.download_dir


def test_every_mistake_of_a_file_is_listed(capsys, tmp_path):
    unknown = yaml.safe_load((ROOT / "examples/llama-3-8b.yaml").read_text())
    unknown["spec"]["model"]["source"] = "builtin:nope"  # the CRD admits it; the server has none
    docs = [
        unknown,
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf-token"}},
        yaml.safe_load((ROOT / "examples/llama-3-70b-tp4.yaml").read_text()),
    ]
    docs[2]["spec"]["engine"]["extraArgs"] = ["--tensor-parallel-size", "16"]  # past 8 ranks
    path = tmp_path / "all.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    code, _, err = run(capsys, "-f", str(path))
    assert code == 1
    assert "LLMService llama-3-8b:" in err and "LLMService llama-3-70b:" in err


def test_render_reads_stdin_and_sets_the_namespace(monkeypatch, capsys):
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO((ROOT / "examples/smollm2-cpu.yaml").read_text()))
    code, out, _ = run(capsys, "-f", "-", "-n", "team-a", "--service-monitor")
    assert code == 0
    docs = list(yaml.safe_load_all(out))
    assert {d["metadata"]["namespace"] for d in docs} == {"team-a"}
    assert "ServiceMonitor" in {d["kind"] for d in docs}


def test_usage_mistakes_exit_2(capsys):
    with pytest.raises(SystemExit) as caught:
        main(["-f", "x.yaml", "--max-gpu-memory-utilization", "1.0"])
    assert caught.value.code == 2
    assert "must lie in [0.5, 0.95]" in capsys.readouterr().err


def test_without_cel_python_render_says_what_to_install():
    code = (
        "import sys\n"
        "sys.modules['celpy'] = None  # as if cel-python were not installed\n"
        "from llmservice.operator.render_cli import main\n"
        "sys.exit(main(['-f', 'examples/smollm2-cpu.yaml']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)  # fmt: skip
    assert done.returncode == 1
    assert "need cel-python: pip install 'cel-python>=0.2'" in done.stderr


def test_a_missing_crd_is_named(capsys, tmp_path):
    code, _, err = run(capsys, "-f", str(ROOT / "examples/smollm2-cpu.yaml"), "--crd",
                       str(tmp_path / "none.yaml"))  # fmt: skip
    assert code == 1 and "pass --crd PATH" in err
