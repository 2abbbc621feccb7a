"""One error root for sparkcep, a subclass per layer.

Every error carries a stable ``code`` (tests assert on it) and a message that
names the stream, field and row concerned and says what was expected.
"""


class SparkcepError(Exception):
    """Root of every error sparkcep raises."""

    code = "SPARKCEP"

    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code


class SchemaError(SparkcepError):
    """A schema, type name or field reference is invalid."""

    code = "SCHEMA"


class QueryError(SparkcepError):
    """A query is malformed: bad operator arguments, incompatible inputs."""

    code = "QUERY"


class InputError(SparkcepError):
    """A batch sent into a stream was rejected; nothing of it was applied."""

    code = "INPUT"


class UnknownStreamError(SparkcepError):
    """A stream name that no deployed query declares."""

    code = "UNKNOWN_STREAM"


class EngineError(SparkcepError):
    """The engine or one of its processes failed."""

    code = "ENGINE"


class OperatorError(EngineError):
    """An operator raised while running: its deployment fails, the epoch it was in leaves no trace."""

    code = "OPERATOR_FAILED"
