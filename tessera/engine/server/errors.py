"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with the HTTP status OpenAI uses."""

from __future__ import annotations

from tessera.engine.errors import ContextOverflowError, TesseraError


class ApiError(Exception):
    """An error answered to the client. status: the HTTP status; type/code: OpenAI's names for it."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(param: str | None, message: str, code: str | None = None) -> ApiError:
    text = f"{param}: {message}" if param else message
    return ApiError(400, text, param=param, code=code)


# The engine names sampling problems by CLI flag; the API names them by request field.
_FLAG_TO_PARAM = {
    "--temperature": "temperature", "--top-k": "top_k", "--top-p": "top_p", "--min-p": "min_p",
    "--repetition-penalty": "repetition_penalty", "--max-tokens": "max_tokens", "--seed": "seed", "--stop": "stop",
    "--presence-penalty": "presence_penalty", "--frequency-penalty": "frequency_penalty",
}


def from_engine_error(e: TesseraError) -> ApiError:
    """A request the engine refused (bad messages, prompt too long, bad sampling values) as a 400."""
    param = _FLAG_TO_PARAM.get(e.subject)
    if isinstance(e, ContextOverflowError):
        return ApiError(400, f"{e.subject}: {e.message}", param="messages", code="context_length_exceeded")
    if param is not None:
        return bad_request(param, e.message)
    return ApiError(400, f"{e.subject}: {e.message}", param=None)


def server_error(message: str) -> ApiError:
    return ApiError(500, message, type="server_error", code="internal_error")
