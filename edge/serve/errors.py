"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with the right HTTP status.

Every refusal edge-serve makes is an `ApiError`; the app turns it (and bad JSON, failed validation, edge's own
errors, unknown routes) into one of these bodies, so a client never sees a traceback.
"""

from __future__ import annotations

from pydantic import ValidationError
from starlette.responses import JSONResponse

from edge.text.chat_template import TemplateFaultError
from edge.errors import ContextLengthError, EdgeError, EngineBusyError, PromptError


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def from_validation(error: ValidationError) -> ApiError:
    """The first problem pydantic found, named by its field path (`messages[0].role`)."""
    problem = error.errors(include_url=False)[0]
    param = field_path(problem["loc"])
    if problem["type"] == "extra_forbidden":
        return ApiError(400, f"Unrecognized request argument supplied: {param}", param=param,
                        code="unknown_parameter")
    if problem["type"] == "missing":
        return ApiError(400, f"Missing required parameter: {param}", param=param, code="missing_required_parameter")
    message = str(problem["msg"]).removeprefix("Value error, ")
    return ApiError(400, f"Invalid value for {param}: {message}" if param else message, param=param or None,
                    code="invalid_value")


def field_path(location: tuple) -> str:
    path = ""
    for part in location:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def from_edge_error(error: EdgeError, param: str) -> ApiError:
    """edge's errors are about the request (edge/errors.py: bad input), so 400, with the one-line message; a
    prompt that does not fit the context gets OpenAI's code for it. A chat template that fails by its own fault (past
    its limits, refused by the sandbox, using an undefined name) is the model's fault: a 500 that says so."""
    if isinstance(error, EngineBusyError):  # never expected: one worker runs every generation
        return ApiError(503, str(error), kind="unavailable_error", code="engine_busy")
    if isinstance(error, TemplateFaultError):  # the model's template is at fault, not the request
        return ApiError(500, str(error), kind="server_error", code="chat_template_error")
    if isinstance(error, ContextLengthError):
        return ApiError(400, str(error), param=param, code="context_length_exceeded")
    return ApiError(400, str(error), param=param if isinstance(error, PromptError) else None)


def api_error(error: BaseException, param: str) -> ApiError:
    """What ended a job, as the client gets it: an ApiError as is, edge's errors as `from_edge_error` says, anything
    else a 500 that points to the log."""
    if isinstance(error, ApiError):
        return error
    if isinstance(error, EdgeError):
        return from_edge_error(error, param)
    return ApiError(500, "internal error in edge-serve (see its log)", kind="server_error")
