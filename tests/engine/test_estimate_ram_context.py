"""estimate_ram sizes the KV cache a load really makes: a context wish over the model's trained context is clamped to
it, as engine.session clamps it, whichever caller asks (the fit line, check --model, the wizard)."""

from tessera.engine.model_info import estimate_ram, inspect_model


def test_a_wish_over_the_trained_context_is_sized_as_the_trained_context(tiny_gguf_model):
    info = inspect_model(tiny_gguf_model)
    trained = estimate_ram(info, info.context_length, "Reference")
    over = estimate_ram(info, info.context_length * 8, "Reference")
    assert over.context_length == trained.context_length == info.context_length
    assert over.kv_bytes == trained.kv_bytes > 0


def test_a_shorter_context_takes_a_smaller_kv_cache(tiny_gguf_model):
    info = inspect_model(tiny_gguf_model)
    short = estimate_ram(info, info.context_length // 4, "Reference")
    assert short.context_length == info.context_length // 4
    assert short.kv_bytes < estimate_ram(info, None, "Reference").kv_bytes
