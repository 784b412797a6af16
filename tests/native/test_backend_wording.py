"""One wording per thing (issue 15 item 12): every backend a user may choose has its own description, from one place
(the native registry, or engine.backends for Torch); Torch reads the same in the backend list, after resolving it (the
status bar's reason) and in `--help`; the hardware wizard offers the engine's own list of published models."""

from __future__ import annotations

from tessera.engine import backends


def test_every_backend_has_its_own_description():
    rows = [b for b in backends.table() if b.name != backends.AUTO]
    descriptions = [b.description for b in rows]
    assert all(descriptions) and len(set(descriptions)) == len(descriptions), descriptions
    by_name = {b.name: b.description for b in rows}
    assert "int8" in by_name["AMXInt8"] and "bf16" in by_name["AMXBF16"]


def test_no_two_available_backends_give_the_same_reason():
    """The reason is what the settings list, the status bar and Auto's note show for a backend that runs here."""
    reasons = [b.reason for b in backends.table() if b.available and b.name != backends.AUTO]
    assert len(set(reasons)) == len(reasons), reasons


def test_torch_is_described_one_way_everywhere():
    torch_row = next(b for b in backends.table() if b.name == backends.TORCH)
    assert torch_row.description == torch_row.reason == backends.TORCH_DESCRIPTION
    assert backends.resolve(backends.TORCH) == (backends.TORCH, backends.TORCH_DESCRIPTION)
    assert backends.status()[backends.TORCH] == (True, backends.TORCH_DESCRIPTION)


def test_torch_in_the_cli_help_is_the_same_wording(capsys):
    import pytest

    from tessera.engine.cli import main  # generate's --backend help comes from engine.cli.run_options

    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"Torch: {backends.TORCH_DESCRIPTION}" in help_text


def test_the_hardware_wizard_offers_the_engines_published_models():
    from tessera.app.wizards.jobs import hardware_presets
    from tessera.engine.config import PUBLISHED

    assert [key for _, key in hardware_presets()] == list(PUBLISHED)
    assert [name for name, _ in hardware_presets()] == [cfg.source for cfg in PUBLISHED.values()]
