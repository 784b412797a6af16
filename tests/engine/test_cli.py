"""`tessera-cli generate | chat | bench`: output shapes, stats lines, exit codes and one-line errors."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
from hf_reference import single_thread  # noqa: F401

from tessera.engine.cli import main


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_json_is_one_object(capsys, tiny_gguf_model):
    code, out, err = run_cli(capsys, "generate", str(tiny_gguf_model), "--prompt", "Hello world", "--temperature", "0",
                             "--max-tokens", "7", "--backend", "Torch", "--threads", "1", "--json")
    assert code == 0, err
    obj = json.loads(out)  # exactly one JSON document, nothing else on stdout
    assert set(obj) == {"text", "token_ids", "metrics"}
    assert 1 <= len(obj["token_ids"]) <= 7 and all(isinstance(t, int) for t in obj["token_ids"])
    m = obj["metrics"]
    assert m["generated_tokens"] == len(obj["token_ids"])
    assert (m["stop_reason"], len(obj["token_ids"]) == 7) in (("max_tokens", True), ("eos", False))
    for key in ("prompt_tokens", "reused_tokens", "ttft_s", "prefill_tok_s", "decode_tok_s"):
        assert key in m
    assert m["prompt_tokens"] > 0 and m["reused_tokens"] == 0 and m["backend"] == "Torch"


def test_generate_text_then_stats_line_and_seed(capsys, tiny_hf_model):
    args = ("generate", str(tiny_hf_model), "--prompt", "Once upon a time", "--max-tokens", "12", "--seed", "3",
            "--temperature", "1.0", "--backend", "Torch")
    code, out1, _ = run_cli(capsys, *args)
    assert code == 0
    lines = out1.rstrip("\n").split("\n")
    assert lines[-1].startswith("[prompt ") and "decode" in lines[-1] and "tok/s" in lines[-1]
    _, out2, _ = run_cli(capsys, *args)
    text = lambda o: o.rstrip("\n").rsplit("\n", 1)[0]  # noqa: E731
    assert text(out1) == text(out2)  # same seed, same text


def test_generate_chat_mode(capsys, tiny_hf_model):
    code, out, err = run_cli(capsys, "generate", str(tiny_hf_model), "--prompt", "Hi", "--chat", "--system", "Be nice",
                             "--no-thinking", "--max-tokens", "5", "--temperature", "0", "--backend", "Torch", "--json")
    assert code == 0, err
    assert json.loads(out)["metrics"]["prompt_tokens"] > 5  # the chat template wrapped the message


@pytest.mark.parametrize(
    "flags, subject",
    [(["--top-p", "2"], "--top-p"), (["--temperature", "-1"], "--temperature"), (["--threads", "0"], "--threads"),
     (["--system", "x"], "--system")],
)
def test_bad_flag_values_are_usage_errors(capsys, tiny_hf_model, flags, subject):
    code, out, err = run_cli(capsys, "generate", str(tiny_hf_model), "--prompt", "x", *flags)
    assert code == 2 and out == ""
    assert err.startswith(f"error: {subject}: ") and err.count("\n") == 1


def test_missing_model_and_long_prompt_are_errors(capsys, tmp_path, tiny_hf_model):
    code, out, err = run_cli(capsys, "generate", str(tmp_path / "nope.gguf"), "--prompt", "x")
    assert code == 1 and out == "" and err.startswith("error: ") and err.count("\n") == 1
    assert "nope.gguf" in err
    code, out, err = run_cli(capsys, "generate", str(tiny_hf_model), "--prompt", "word " * 50, "--context-length", "16",
                             "--backend", "Torch")
    assert code == 1 and err.startswith("error: prompt: ") and "context of 16" in err and err.count("\n") == 1


def test_bench_json(capsys, tiny_hf_model):
    code, out, err = run_cli(capsys, "bench", str(tiny_hf_model), "--prompt-tokens", "20", "--gen-tokens", "5",
                             "--backend", "Torch", "--json")
    assert code == 0, err
    obj = json.loads(out)
    assert obj["prefill_tok_s"] > 0 and obj["decode_tok_s"] > 0
    assert obj["prompt_tokens"] == 20 and obj["gen_tokens"] == 5
    assert obj["model_map_huge_share"] is None  # safetensors: read, not mapped


def test_bench_json_says_how_much_of_a_gguf_map_is_on_huge_pages(capsys, tiny_gguf_model):
    code, out, err = run_cli(capsys, "bench", str(tiny_gguf_model), "--prompt-tokens", "8", "--gen-tokens", "2",
                             "--backend", "Torch", "--json")
    assert code == 0, err
    share = json.loads(out)["model_map_huge_share"]
    assert share is not None and 0.0 <= share <= 1.0  # the file is mapped and was read


def test_chat_keeps_kv_between_turns(capsys, monkeypatch, tiny_hf_model):
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hello!\n/reset\nHello!\nAnd then?\n/exit\n"))
    code, out, err = run_cli(capsys, "chat", str(tiny_hf_model), "--max-tokens", "6", "--temperature", "0",
                             "--no-thinking", "--backend", "Torch")
    assert code == 0, err
    stats = [line for line in out.splitlines() if line.startswith("[prompt ")]
    assert len(stats) == 3
    reused = [int(s.split("(reused ")[1].split(")")[0]) for s in stats]
    assert reused[1] > 0 and reused[2] > 0  # the repeated first message and the second turn hit the prefix cache


@pytest.mark.slow
def test_real_process_exit_code_and_no_traceback(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + b"\0" * 64)
    r = subprocess.run([sys.executable, "-m", "tessera.engine", "generate", str(bad), "--prompt", "x"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith("error: ") and "Traceback" not in r.stderr and r.stderr.count("\n") == 1


def test_cli_defaults_equal_sampling_params_and_help_needs_no_torch():
    from tessera.engine.cli.run_options import DEFAULTS
    from tessera.engine.sampling import SamplingParams

    d = SamplingParams()
    assert vars(DEFAULTS) == {k: getattr(d, k) for k in vars(DEFAULTS)}
    code = "import sys; from tessera.engine.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "False", r.stderr


def test_a_command_line_imports_only_its_command_s_module():
    """main builds the parser of the named command only (the others' modules, e.g. the converter and the hardware
    probe, cost ~0.08 s of every generate); --help and an unknown command still list every command."""
    code = ("import sys; from tessera.engine.cli import _command, build_parser; "
            "build_parser(_command(['--debug', 'generate', 'm.gguf', '--prompt', 'x'])).parse_args("
            "['generate', 'm.gguf', '--prompt', 'x']); "
            "print(sorted(m for m in sys.modules if m.startswith('tessera.engine.cli.')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    loaded = r.stdout.strip()
    assert "tessera.engine.cli.generate" in loaded and "tessera.engine.cli.convert" not in loaded, r.stderr
    assert "tessera.engine.cli.make_model" not in loaded and "tessera.engine.cli.check" not in loaded
    r = subprocess.run([sys.executable, "-m", "tessera.engine", "bogus"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "invalid choice" in r.stderr and "make-model" in r.stderr and "generate" in r.stderr


def test_a_generate_process_ends_without_the_interpreter_teardown_and_says_everything(tiny_gguf_model, tmp_path):
    """As the process's entry (no argv), generate ends by os._exit after flushing its output and running the atexit
    handlers (the teardown with torch loaded took 0.3 s); the exit code and every line printed are as before."""
    probe = tmp_path / "atexit-ran"
    code = ("import atexit, pathlib, sys; "
            f"atexit.register(lambda: pathlib.Path({str(probe)!r}).write_text('yes')); "
            "from tessera.engine.cli import main; sys.exit(main())")
    env = dict(os.environ, TESSERA_PACK_CACHE_DIR=str(tmp_path / "packed"))
    r = subprocess.run([sys.executable, "-c", code, "generate", str(tiny_gguf_model), "--prompt", "Hello",
                        "--max-tokens", "2", "--temperature", "0", "--backend", "Reference"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip().splitlines()[-1].startswith("[prompt ") and probe.read_text() == "yes"
    r = subprocess.run([sys.executable, "-c", code, "generate", str(tiny_gguf_model), "--prompt", ""],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 2 and "--prompt: is empty" in r.stderr
