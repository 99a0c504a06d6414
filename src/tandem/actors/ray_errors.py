"""tandem's errors for what calls on the scheduler actor raise, as callers of the handle
see them: the actor's own tandem error where it raised one, EngineUnavailableError once
the actor is gone."""
from __future__ import annotations

from tandem.errors import EngineUnavailableError, TandemError


def tandem_error(e: Exception) -> Exception:
    """tandem's error for what a call on the scheduler actor raised: the actor's own
    exception where it is tandem's; EngineUnavailableError once the actor is gone (under
    Serve a new engine replica is on its way: a client should retry, not give up)."""
    import ray

    # (a RayTaskError may also pass for its cause's class: an actor the scheduler called died)
    if isinstance(e, ray.exceptions.RayActorError) and not isinstance(e, ray.exceptions.RayTaskError):
        return EngineUnavailableError(f"the engine's scheduler actor is gone ({type(e).__name__}); "
                                      "a served app starts a new one")
    cause = getattr(e, "cause", None)  # Ray wraps an actor's exception
    return cause if isinstance(cause, TandemError) else e


def engine_gone(e: Exception) -> bool:
    """Whether a broken output stream says the scheduler actor is gone: its socket reset
    or closed mid-frame, or Ray's stream from it (or the call that opens it) lost the actor."""
    import ray

    if isinstance(e, EngineUnavailableError):
        return True
    return isinstance(e, (OSError, EOFError, ray.exceptions.RayActorError)) and not isinstance(
        e, ray.exceptions.RayTaskError)


class tandem_errors:
    """`with` or `async with` around calls on the scheduler actor: what they raise comes
    out as tandem_error makes it."""

    def __enter__(self):
        return self

    def __exit__(self, kind, e, tb):
        import ray

        if isinstance(e, (ray.exceptions.RayTaskError, ray.exceptions.RayActorError)):
            raise tandem_error(e) from None
        return False

    async def __aenter__(self):
        return self

    async def __aexit__(self, kind, e, tb):
        return self.__exit__(kind, e, tb)
