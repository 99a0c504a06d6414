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


class EngineAutoscaling(BaseModel):
    """The engine deployment's replica count following its load (tandem.serve.autoscaling)."""

    model_config = ConfigDict(extra="forbid")

    min_replicas: int = Field(1, ge=1, le=256, description="Fewest engine replicas.")
    max_replicas: int = Field(2, ge=1, le=256, description="Most engine replicas.")
    target_load_tokens: int = Field(8192, ge=1, description="Load per replica (queued + running tokens) to keep under: one more replica once it is above for upscale_window_s; one fewer once the rest would stay under half of it for downscale_window_s.")
    upscale_window_s: float = Field(30.0, gt=0, le=3600, description="How long the load per replica stays above the target before a replica is added.")
    downscale_window_s: float = Field(120.0, gt=0, le=86400, description="How long the load stays low enough before a replica is removed (it drains first).")

    @model_validator(mode="after")
    def _check_bounds(self):
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"autoscaling: max_replicas {self.max_replicas} is below min_replicas {self.min_replicas}")
        return self

    @classmethod
    def parse(cls, text: str) -> "EngineAutoscaling":
        """From the command line: JSON of the fields, or MIN:MAX[:TARGET_LOAD_TOKENS]."""
        if text.lstrip().startswith("{"):
            return cls.model_validate_json(text)
        parts = text.split(":")
        if not 2 <= len(parts) <= 3:
            raise ValueError(f"autoscaling: {text!r} is neither JSON nor MIN:MAX[:TARGET_LOAD_TOKENS]")
        names = ("min_replicas", "max_replicas", "target_load_tokens")
        return cls(**{k: int(v) for k, v in zip(names, parts)})


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
    ingress_replicas: int = Field(1, ge=1, le=64, description="HTTP ingress replicas in front of the engine replicas, each a process of its own that parses its share of the requests and writes its share of the streams. More than 1 needs Serve's HAProxy mode in the cluster (RAY_SERVE_ENABLE_HA_PROXY=1 where Ray starts; `tandem serve --ingress-replicas N` sets it up) to put them behind one port.")
    engine_actor_name: str | None = Field(None, description="Name the scheduler actor (Ray namespace 'tandem') so other Ray programs can use the served engine through tandem.actors.connect(name). Several engine replicas (engine_replicas > 1, autoscaling) are named '<name>/<replica id>'; connect(name) finds the first.")
    engine_replicas: int = Field(1, ge=1, le=256, description="Engine replicas, each its own scheduler actor and tensor_parallel_size shard actors in a placement group of its own; every ingress replica routes each request to one of them (prefix_routing, else the least loaded).")
    autoscaling: EngineAutoscaling | None = Field(None, description="Scale the engine replicas on their load instead of a fixed engine_replicas: {min_replicas, max_replicas, target_load_tokens, upscale_window_s, downscale_window_s} (`tandem serve --autoscaling MIN:MAX[:TARGET]` or JSON).")
    prefix_routing: bool = Field(True, description="Send a request whose prompt starts with a prefix an engine replica holds in its prefix cache (whole 256-character chunks of its text) to that replica, unless prefix_overload_tokens makes it too busy; else to the least loaded replica.")
    prefix_overload_tokens: int = Field(8192, ge=0, description="How many tokens more load (queued + running) than the least loaded replica the replica holding a request's prefix may have and still get it: past that, waiting behind its queue costs more than prefilling the prefix again elsewhere would save.")
    health_check_period_s: float = Field(10.0, gt=0, le=600, description="How often Serve checks each replica's health. After three failed checks in a row Serve replaces the replica: an engine replica whose scheduler actor was lost is replaced about three periods later.")
    drain_timeout_s: float = Field(120.0, gt=0, le=3600, description="How long an engine replica that is being removed (scale-down, an update) keeps generating for the requests it holds, taking no new ones, before it stops.")

    @model_validator(mode="after")
    def _check_replicas(self):
        if self.autoscaling is not None and self.engine_replicas != 1:
            raise ValueError(f"engine_replicas: give engine_replicas ({self.engine_replicas}) or autoscaling, not both")
        return self

    @property
    def fixed_single_engine(self) -> bool:
        return self.engine_replicas == 1 and self.autoscaling is None

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
        if self.dflash_checkpoint is not None and self.drafter is not None and drafter_kind(self.drafter).checkpoint is None:
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
