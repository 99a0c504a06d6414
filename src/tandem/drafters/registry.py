"""The drafter registry: each drafter's name, where it runs, and what it checks in a
config. The one place that knows drafters by name (building them: drafters.factory)."""
from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from tandem.errors import InvalidRequestError


# target model name (LoadedModel.name) -> the DFlash weights shipped for it, a folder of
# drafters/dflash/weights (here, not there: choosing a default drafter loads no torch)
SHIPPED_DFLASH = {"smollm2": "smollm2"}


@dataclass(frozen=True)
class DrafterKind:
    name: str
    runs: str  # "nowhere", "scheduler" (beside the engine) or "rank" (on shard rank 0: it has a model)
    whole_blocks: bool = False  # drafts a whole block a round (see tandem.batching.batch_width)
    needs_draft_model: bool = False  # a draft_model must be configured
    # (model, checkpoint) -> (its absolute folder, the most drafts it gives a round), for a
    # drafter whose checkpoint caps its drafts; InvalidRequestError naming the field otherwise
    checkpoint: Callable[[str | None, str | None], tuple[str, int]] | None = None
    # copy_min_ngram when the config leaves it None (a model drafter's lookup of copies)
    copy_min_ngram: int = 0

    @property
    def on_rank(self) -> bool:
        return self.runs == "rank"


def resolve_dflash_checkpoint(model: str | None, checkpoint: str | None) -> tuple[str, int]:
    """(absolute folder, block_size) of the DFlash checkpoint an engine on `model` loads:
    `checkpoint`, or the weights shipped for the model when it is None. Reads only the
    folder's config.json; InvalidRequestError naming dflash_checkpoint when it does not fit."""
    from tandem.drafters.dflash import DFlashConfig, shipped_checkpoint
    from tandem.model.registry import model_name

    field = "dflash_checkpoint"
    if checkpoint is None:
        try:
            folder = shipped_checkpoint(model_name(model))
        except ValueError as e:
            raise InvalidRequestError(field, str(e)) from None
    else:
        folder = os.path.abspath(os.path.expanduser(checkpoint))
        if not os.path.isdir(folder):
            raise InvalidRequestError(field, f"{checkpoint!r} is not a folder (give a DFlash checkpoint folder)")
    config_path = os.path.join(folder, "config.json")
    has_weights = any(name.endswith(".safetensors") for name in os.listdir(folder))
    if not os.path.isfile(config_path) or not has_weights:
        raise InvalidRequestError(field, f"{folder!r} is not a DFlash checkpoint (it needs config.json and *.safetensors)")
    try:
        with open(config_path) as f:
            config = DFlashConfig.from_dict(json.load(f))
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # JSONDecodeError is a ValueError
        raise InvalidRequestError(field, f"{folder!r} is not a DFlash checkpoint: {type(e).__name__}: {e}") from None
    return folder, config.block_size


def _dflash_drafts(model: str | None, checkpoint: str | None) -> tuple[str, int]:
    folder, block_size = resolve_dflash_checkpoint(model, checkpoint)
    return folder, block_size - 1  # one block = the last token + block_size - 1 drafts


DRAFTER_KINDS: dict[str, DrafterKind] = {k.name: k for k in (
    DrafterKind("none", runs="nowhere"),
    DrafterKind("ngram", runs="scheduler"),
    DrafterKind("draft-model", runs="rank", needs_draft_model=True),
    DrafterKind("dflash", runs="rank", whole_blocks=True, checkpoint=_dflash_drafts, copy_min_ngram=2),
)}
DRAFTERS = tuple(DRAFTER_KINDS)
DrafterName = Literal[DRAFTERS]  # a config's drafter field: the CLI's choices, the served args' check


def default_drafter(model: str | None, dflash_checkpoint: str | None) -> str:
    """The drafter a config that names none gets: dflash where there are DFlash weights for
    `model` (a checkpoint given, or the weights shipped for it, as for the default model),
    else ngram."""
    from tandem.model.registry import model_name

    return "dflash" if dflash_checkpoint is not None or model_name(model) in SHIPPED_DFLASH else "ngram"


def drafter_kind(name: str) -> DrafterKind:
    """The registered drafter `name`; InvalidRequestError naming `drafter` for any other."""
    kind = DRAFTER_KINDS.get(name)
    if kind is None:
        raise InvalidRequestError("drafter", f"unknown drafter {name!r}; choose one of {', '.join(DRAFTERS)}")
    return kind
