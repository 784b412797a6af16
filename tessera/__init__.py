"""Tessera: chat with Qwen3-MoE models on one workstation.

One package, so that an installed Tessera adds only `tessera` to site-packages:
`tessera.app` (the desktop app, `python -m tessera.app`), `tessera.engine` (the engine and `tessera-cli`,
`python -m tessera.engine`) and `tessera/resources` (icons, the demo model, placement rules). Importing `tessera`
imports nothing else.
"""
