"""The builder's arguments: what a Serve config, KubeRay's serveConfigV2 or `tandem serve`
may set, as one pydantic model, TandemServeArgs.

Its engine fields are EngineConfig's (tandem.config) and its placement fields
SchedulerSettings' (tandem.actors.settings), taken with their types, defaults, bounds and
help: the served engine has the embedded engine's options and defaults, and nothing is
copied by hand. The HTTP layer's own fields (ingress, limits, the API key) are declared
here. `tandem serve`'s flags and the README's tables derive from this model.
"""
from __future__ import annotations

import dataclasses

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from tandem.actors.settings import SchedulerSettings
from tandem.config import EngineConfig
from tandem.config_flags import options_of
from tandem.drafters.registry import drafter_kind
from tandem.errors import InvalidRequestError


class _ServingArgs(BaseModel):
    """The fields of the serving layer; TandemServeArgs adds the engine's."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    tensor_parallel_size: int = Field(1, ge=1, le=64, description="Shard ranks the target is split over (one shard actor each, one GPU each where there are GPUs).")
    max_tokens_limit: int = Field(1024, ge=1, description="Largest max_tokens a request may ask for.")
    max_body_bytes: int = Field(8 << 20, ge=1024, le=1 << 30, description="Largest request body in bytes; a larger one is answered 413 (from its Content-Length, before it is read). 8 MiB holds a long context many times over, as text or token ids.")
    max_prompt_chars: int | None = Field(None, ge=1, description="Longest prompt text in characters (a completion's prompt, or a chat's message contents together), refused with a 400 before it reaches the tokenizer, which runs on the engine's step thread (1 MB of text stalls every running stream ~1.4 s on a CPU core). None = 32 x max_model_len: no longer text fits the context (real text runs ~4 characters a token). The exact cap on prompt tokens is max_model_len.")
    max_stop_strings: int = Field(4, ge=0, le=64, description="Most stop strings a request may give (OpenAI's limit is 4).")
    max_stop_chars: int = Field(256, ge=1, le=65536, description="Longest stop string in characters: every stream holds back that much text while it might be a stop string's start.")
    max_waiting_requests: int = Field(128, ge=0, description="Requests each ingress replica holds beyond the engine's max_num_seqs slots, waiting for one; past that a request is answered 429 with Retry-After. 128 (4 x the default max_num_seqs): one at the back of that queue waits about four requests' time, beyond which coming back later serves a client better than a queue it would time out in.")
    api_key: str | None = Field(None, description="When set, requests must carry 'Authorization: Bearer <api_key>'.")
    max_ongoing_requests: int = Field(1024, ge=1, description="Requests each ingress replica takes at once (Serve's max_ongoing_requests); more wait in the proxy.")
    ingress_replicas: int = Field(1, ge=1, le=64, description="HTTP ingress replicas in front of the one engine, each a process of its own that parses its share of the requests and writes its share of the streams. More than 1 needs Serve's HAProxy mode in the cluster (RAY_SERVE_ENABLE_HA_PROXY=1 where Ray starts; `tandem serve --ingress-replicas N` sets it up) to put them behind one port.")
    engine_actor_name: str | None = Field(None, description="Name the scheduler actor (Ray namespace 'tandem') so other Ray programs can use the served engine through tandem.actors.connect(name).")

    @field_validator("dflash_checkpoint", check_fields=False)
    @classmethod
    def _absolute_checkpoint(cls, value: str | None) -> str | None:
        # checked here, and made absolute: the shard actors do not run in this cwd
        if value is None:
            return None
        try:
            return drafter_kind("dflash").checkpoint(None, value)[0]
        except InvalidRequestError as e:
            raise ValueError(e.message) from None

    @model_validator(mode="after")
    def _check_in_process_target(self):
        if self.in_process_target and self.tensor_parallel_size != 1:
            raise ValueError(f"in_process_target: holds one rank, not tensor_parallel_size {self.tensor_parallel_size}")
        return self

    @model_validator(mode="after")
    def _check_engine(self):
        """What EngineConfig checks (the drafter's checkpoint and draft count, the row
        budget), before anything starts."""
        if self.dflash_checkpoint is not None and drafter_kind(self.drafter).checkpoint is None:
            raise ValueError(f"dflash_checkpoint: is for drafter=dflash, not {self.drafter!r}")
        try:
            self.engine_config()
        except InvalidRequestError as e:
            raise ValueError(str(e)) from None
        return self

    def engine_options(self) -> dict:
        """The EngineConfig fields this app sets (an environment-backed one left None keeps
        the engine's own default, read where the engine runs)."""
        options = {name: getattr(self, name) for name in ENGINE_FIELDS}
        return {k: v for k, v in options.items() if v is not None or k not in _ENV_BACKED}

    def engine_config(self) -> EngineConfig:
        return EngineConfig(shards=self.tensor_parallel_size, **self.engine_options())

    def settings_options(self) -> dict:
        """The SchedulerSettings fields this app sets."""
        return {name: getattr(self, name) for name in SETTINGS_FIELDS}


def _fields_of(config, exclude: tuple[str, ...]) -> dict[str, tuple]:
    """A config dataclass's fields as pydantic fields: type, default, bounds and help."""
    out = {}
    for o in options_of(config, exclude):
        bounds = {k: o.metadata[k] for k in ("gt", "ge", "le") if k in o.metadata}
        if o.default is dataclasses.MISSING:  # read from the environment where the engine runs
            kind, default = o.annotation | None, None
        else:
            kind, default = o.annotation, o.default
        out[o.name] = (kind, Field(default, description=o.help, **bounds))
    return out


_ENV_BACKED = {f.name for f in dataclasses.fields(EngineConfig) if "env" in f.metadata}
# EngineConfig's `shards` is tensor_parallel_size here (the ranks are shard actors); the
# settings' engine is built from the engine's fields, and tests alone inject faults
_ENGINE = _fields_of(EngineConfig, exclude=("shards",))
_SETTINGS = _fields_of(SchedulerSettings, exclude=("engine", "init_deadline_s", "fault_injection"))
ENGINE_FIELDS, SETTINGS_FIELDS = tuple(_ENGINE), tuple(_SETTINGS)

TandemServeArgs = create_model("TandemServeArgs", __base__=_ServingArgs, __module__=__name__, **_ENGINE, **_SETTINGS)
TandemServeArgs.__doc__ = "The served app's arguments: the serving layer's fields, then EngineConfig's and SchedulerSettings'."
