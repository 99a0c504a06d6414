"""`tandem serve --in-process-target` and `--no-session-socket`: the flags reach the app's
arguments, and a combination it cannot serve is refused before Ray starts, naming the field."""
from __future__ import annotations

import pytest

from tandem.serve import cli as serve_cli

from .cli_args import cli_args


def test_the_flag_reaches_the_app_arguments():
    assert serve_cli.serve_args(cli_args("--in-process-target")).in_process_target is True
    assert serve_cli.serve_args(cli_args()).in_process_target is False


def test_the_session_socket_is_on_unless_turned_off():
    assert serve_cli.serve_args(cli_args()).session_socket is True
    assert serve_cli.serve_args(cli_args("--no-session-socket")).session_socket is False


def test_an_in_process_target_with_two_shards_is_refused_before_ray_starts(capsys, monkeypatch):
    import tandem.actors.cluster

    monkeypatch.setattr(tandem.actors.cluster, "init_local_ray", lambda **_: pytest.fail("Ray was started"))
    assert serve_cli.run(cli_args("--in-process-target", "--shards", "2")) == 2
    assert "tandem serve: in_process_target: holds one rank, not tensor_parallel_size 2" in capsys.readouterr().err
