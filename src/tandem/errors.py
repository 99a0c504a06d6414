"""Errors that cross tandem's layers. Each names what failed, so a caller can act on it."""


class TandemError(Exception):
    """Base class of tandem's own errors."""


class InvalidRequestError(TandemError, ValueError):
    """A request (or one of its fields) is malformed. Raised before anything runs,
    so no other request is touched. `field` names the offending field."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def __reduce__(self):  # pickle by the constructor's arguments (Ray, multiprocessing)
        return (type(self), (self.field, self.message))


class ShapeError(TandemError, ValueError):
    """A verify-batch command breaks one of the shape rules; `rule` names which."""

    def __init__(self, rule: str, message: str):
        super().__init__(f"{rule}: {message}")
        self.rule = rule
        self.message = message

    def __reduce__(self):
        return (type(self), (self.rule, self.message))


class ShardError(TandemError):
    """A shard (or the whole shard group) failed a command.

    `state_advanced` tells the engine what it may still trust: False means no
    rank changed any state (a single in-process rank whose forward raised), so
    the same command may be retried; True means some rank may have moved on (or
    was lost), so the sequences involved must be finished with an error.
    `unhealthy` means the group needs a restart before it can serve again.
    """

    def __init__(self, message: str, *, state_advanced: bool = True, unhealthy: bool = False):
        super().__init__(message)
        self.state_advanced = state_advanced
        self.unhealthy = unhealthy

    def __reduce__(self):
        return (_rebuild_shard_error, (type(self), str(self), self.state_advanced, self.unhealthy))


class EngineUnavailableError(TandemError):
    """The engine cannot take requests right now (its shard group is recovering)."""

    def __init__(self, message: str, retry_after_s: float = 5.0):
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def __reduce__(self):
        return (type(self), (str(self), self.retry_after_s))


def _rebuild_shard_error(cls, message, state_advanced, unhealthy):
    return cls(message, state_advanced=state_advanced, unhealthy=unhealthy)
