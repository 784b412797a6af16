"""`tessera-cli cache list|clear|path` (issue 12 item 5) and escaped file strings in CLI errors (issue 13 item 10)."""

import json

import torch

import tessera.engine.native as N
from tessera.engine.cli import main
from tessera.engine.errors import TesseraError
from tessera.engine.experts import LayerExperts


def layers(seed):
    g = torch.Generator().manual_seed(seed)
    w = lambda *s: torch.randn(*s, generator=g).to(torch.bfloat16)  # noqa: E731
    return {0: LayerExperts(w(4, 32, 64), w(4, 32, 64), w(4, 64, 32))}


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cache_list_shows_each_model_and_clear_empties_it(tmp_path, monkeypatch, capsys):
    root = tmp_path / "packed"
    monkeypatch.setenv("TESSERA_PACK_CACHE_DIR", str(root))
    N.make_backend("Reference", layers(1), threads=1, cache_dir=root, model_id="/models/one.gguf")
    N.make_backend("Reference", layers(2), threads=1, cache_dir=root, model_id="/models/two\x1b[2J.gguf")
    (root / "notes.txt").write_text("not the cache's")

    code, out, _ = run(capsys, "cache", "list", "--json")
    listing = json.loads(out)
    assert code == 0 and listing["folder"] == str(root)
    assert [m["model"] for m in listing["models"]] == ["/models/one.gguf", "/models/two\x1b[2J.gguf"]
    file_bytes = sum(p.stat().st_size for p in (root / "layers").glob("*.pack"))
    assert listing["bytes"] == file_bytes == sum(m["bytes"] for m in listing["models"]) > 0
    assert listing["budget"] >= 2 * max(m["bytes"] for m in listing["models"]) or listing["budget"] > 0

    code, out, _ = run(capsys, "cache", "list")
    assert code == 0 and "/models/one.gguf" in out and "two\\x1b[2J.gguf" in out and "\x1b" not in out

    code, out, _ = run(capsys, "cache", "clear")
    assert code == 0 and out.startswith("cleared ")
    assert not list((root / "layers").glob("*")) and not list((root / "models").glob("*"))
    assert (root / "notes.txt").read_text() == "not the cache's"
    code, out, _ = run(capsys, "cache", "list", "--json")
    assert json.loads(out)["models"] == []

    code, out, _ = run(capsys, "cache", "path")
    assert out.strip() == str(root)


def test_cli_errors_print_file_strings_escaped(monkeypatch, capsys):
    import tessera.engine.cli.cache as cache_cli

    def hostile(args):
        raise TesseraError("tensor blk.0\x1b]0;owned\x07", "name from a file \u202eevil")

    monkeypatch.setattr(cache_cli, "run", hostile)
    code, _, err = run(capsys, "cache", "path")
    assert code == 1
    assert err == "error: tensor blk.0\\x1b]0;owned\\x07: name from a file \\u202eevil\n"
