"""Widgets. They only emit and receive signals; they never touch the model runtime."""
