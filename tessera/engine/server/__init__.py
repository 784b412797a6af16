"""Tessera's OpenAI-compatible server (`tessera-cli serve`, the app's "Serve this model"). Qt-free.

- `app.py`: the Starlette app (`create_app(scheduler, ServerOptions)`), routes and SSE streaming.
- `requests.py`: request validation into engine arguments; `errors.py`: OpenAI-shaped errors.
- `chat_output.py`: Qwen3 output -> reasoning_content / content / tool_calls, streamed or whole.
- `run.py`: uvicorn in the foreground or on a thread (`ServerThread`), the loopback/API-key rule.
The engine itself is shared through `engine.scheduler.EngineScheduler`.
"""
