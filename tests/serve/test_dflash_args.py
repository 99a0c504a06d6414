"""The Serve builder args and `tandem serve` for the DFlash drafter: dflash_checkpoint is
checked (the error names it) and made absolute, and num_speculative_tokens is left to the
engine unless given, when it may not exceed the checkpoint's block_size - 1."""
from __future__ import annotations

import os

import pytest
from pydantic import ValidationError

from tandem.serve import cli as serve_cli
from tandem.serve.args import TandemServeArgs

from .cli_args import cli_args


def refusal(**fields) -> str:
    with pytest.raises(ValidationError) as info:
        TandemServeArgs(**fields)
    return serve_cli.validation_message(info.value)


def test_the_checkpoint_is_made_absolute_and_the_draft_count_left_to_the_engine(block4, monkeypatch):
    monkeypatch.chdir(os.path.dirname(block4))
    args = TandemServeArgs(drafter="dflash", dflash_checkpoint=os.path.basename(block4))
    assert args.dflash_checkpoint == block4
    assert args.num_speculative_tokens is None
    assert TandemServeArgs.model_validate(args.model_dump()) == args  # the replica validates it again


def test_a_bad_checkpoint_or_draft_count_is_refused_naming_the_field(block4, tmp_path):
    assert refusal(drafter="dflash", dflash_checkpoint=str(tmp_path / "nope")).startswith("dflash_checkpoint: ")
    assert "config.json" in refusal(drafter="dflash", dflash_checkpoint=str(tmp_path))
    assert refusal(drafter="ngram", dflash_checkpoint=block4).startswith("dflash_checkpoint: ")
    assert refusal(drafter="dflash", model="qwen2.5-coder-0.5b").startswith("dflash_checkpoint: ")
    too_many = refusal(drafter="dflash", dflash_checkpoint=block4, num_speculative_tokens=4)
    assert too_many.startswith("num_speculative_tokens: ") and "block_size - 1 = 3" in too_many
    assert refusal(drafter="dflash", num_speculative_tokens=8).startswith("num_speculative_tokens: ")
    assert TandemServeArgs(drafter="dflash", dflash_checkpoint=block4, num_speculative_tokens=3).num_speculative_tokens == 3


def test_tandem_serve_takes_the_checkpoint_flag(block4):
    args = serve_cli.serve_args(cli_args("--drafter", "dflash", "--dflash-checkpoint", block4))
    assert (args.drafter, args.dflash_checkpoint, args.num_speculative_tokens) == ("dflash", block4, None)


def test_tandem_serve_refuses_a_bad_checkpoint_before_starting_ray(tmp_path, capsys, monkeypatch):
    import tandem.actors.cluster

    monkeypatch.setattr(tandem.actors.cluster, "init_local_ray", lambda **_: pytest.fail("Ray was started"))
    assert serve_cli.run(cli_args("--drafter", "dflash", "--dflash-checkpoint", str(tmp_path / "nope"))) == 2
    assert "tandem serve: dflash_checkpoint: " in capsys.readouterr().err
