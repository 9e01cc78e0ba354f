"""llama.cpp's error JSON: {"error": {"code", "message", "type"}} with the HTTP status equal to `code`."""
from __future__ import annotations

from starlette.responses import JSONResponse

STATUS = {"invalid_request_error": 400, "authentication_error": 401, "permission_error": 403,
          "not_found_error": 404, "server_error": 500, "not_supported_error": 501, "unavailable_error": 503,
          "exceed_context_size_error": 400}


class ApiError(Exception):
    """Raised anywhere in a handler; app.py turns it into the error response."""

    def __init__(self, message: str, type: str = "invalid_request_error", extra: dict | None = None,
                 status: int | None = None):
        super().__init__(message)
        self.message, self.type, self.extra, self.status = message, type, dict(extra or {}), status

    @property
    def code(self) -> int:
        return self.status or STATUS.get(self.type, 500)

    def to_json(self) -> dict:
        return {"error": {"code": self.code, "message": self.message, "type": self.type, **self.extra}}


def error_response(err: ApiError, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(err.to_json(), status_code=err.code, headers=headers)


class ClientGone(ApiError):
    """The client left before its answer was ready: nobody reads this response (499, as nginx logs it)."""

    def __init__(self):
        super().__init__("client closed the connection", "invalid_request_error", status=499)


def bad_request(message: str) -> ApiError:
    return ApiError(message, "invalid_request_error")


def server_error(message: str) -> ApiError:
    return ApiError(message, "server_error")


def not_supported(message: str) -> ApiError:
    return ApiError(message, "not_supported_error")
