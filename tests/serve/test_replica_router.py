"""The routing choice, the prefix keys and index, the autoscaling decision, the replica
arguments and the merged metrics, without Ray (the served app: test_engine_replicas.py)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from tandem.actors.prefix_index import PrefixIndex
from tandem.actors.prefix_keys import CHUNK_CHARS, prefix_keys
from tandem.serve.args import EngineAutoscaling, TandemServeArgs
from tandem.serve.autoscaling import LoadPolicy, autoscaling_config, desired_replicas
from tandem.serve.metrics_merge import merge
from tandem.serve.replica_router import Replica, ReplicaRouter

LONG = "x" * (3 * CHUNK_CHARS)


def router(*loads, overload=1000) -> ReplicaRouter:
    r = ReplicaRouter(True, overload)
    for i, load in enumerate(loads):
        r.replicas[f"e/{i}"] = Replica(f"e/{i}", None, load=load)
    return r


def test_the_least_loaded_replica_gets_a_request_without_a_known_prefix():
    assert router(500, 100, 300).pick([])[0].name == "e/1"


def test_a_burst_between_two_reports_alternates_instead_of_piling_onto_one_replica():
    r = router(0, 0)
    names = []
    for i in range(6):
        replica, _ = r.pick([])
        replica.sent(f"r{i}", 50, [], "load")
        names.append(replica.name)
    assert names.count("e/0") == names.count("e/1") == 3
    for replica in r.replicas.values():  # two reports later the engine's own count has them
        for _ in range(2):
            replica.on_report({"load_tokens": 150, "available": True, "draining": False})
        assert replica.estimate() == 150


def test_a_prefix_holder_gets_the_request_unless_overloaded_past_the_threshold():
    keys = prefix_keys(LONG + "question")
    r = router(900, 100)
    r.replicas["e/0"].prefixes.update(keys[:2])
    assert r.pick(keys) == (r.replicas["e/0"], "prefix")  # 800 above the least: within 1000
    r.replicas["e/0"].load = 1200
    assert r.pick(keys) == (r.replicas["e/1"], "load")
    r.prefix_routing = False
    r.replicas["e/0"].load = 100
    assert r.pick(keys)[1] == "load"


def test_a_replica_that_does_not_serve_gets_nothing():
    r = router(0, 500)
    r.replicas["e/0"].on_report({"load_tokens": 0, "available": True, "draining": True})
    assert r.pick([])[0].name == "e/1"
    r.replicas["e/1"].down = True
    assert r.pick([]) == (None, "none")


def test_prefix_keys_are_shared_exactly_by_prompts_with_the_same_leading_chunks():
    a, b = prefix_keys(LONG + "a" * CHUNK_CHARS), prefix_keys(LONG + "b" * CHUNK_CHARS)
    assert len(a) == len(b) == 4 and a[:3] == b[:3] and a[3] != b[3]
    assert prefix_keys("short") == []
    chat = [{"role": "system", "content": LONG}, {"role": "user", "content": "hi"}]
    assert prefix_keys(None, chat)[:2] != prefix_keys(LONG)[:2]  # roles are part of the text
    assert prefix_keys(list(range(200))) == prefix_keys(list(range(200)) + [7])[:len(prefix_keys(list(range(200))))]


def test_the_prefix_index_forgets_what_the_pool_evicted_and_everything_after_a_restart():
    index = PrefixIndex()
    index.note([1, 2], 10)
    index.follow(0, 1)  # the first look at the shard group's generation forgets nothing
    assert index.keys() == {1, 2}
    index.note([3], 5)
    index.follow(8, 1)  # 8 blocks evicted: the oldest prompt's 10
    assert index.keys() == {3}
    index.note([4], 1)
    index.follow(8, 2)
    assert index.keys() == frozenset()


def test_autoscaling_adds_above_the_target_and_removes_only_well_below_it():
    assert desired_replicas(1, 1500, 1000) == 2
    assert desired_replicas(2, 5000, 1000) == 5
    assert desired_replicas(2, 1500, 1000) == 2
    assert desired_replicas(2, 400, 1000) == 1
    assert desired_replicas(1, 0, 1000) == 1
    # a replica still starting counts: one running under the target keeps the second coming
    starting = SimpleNamespace(current_num_replicas=1, target_num_replicas=2, policy_state={},
                               aggregated_metrics={"load_tokens": {"r1": 600.0}})
    assert LoadPolicy(1000)(starting)[0] == 2
    starting.aggregated_metrics = {"load_tokens": {"r1": 400.0}}
    assert LoadPolicy(1000)(starting)[0] == 1
    config = autoscaling_config(EngineAutoscaling(min_replicas=1, max_replicas=4, upscale_window_s=10))
    assert config["max_replicas"] == 4 and config["upscale_delay_s"] == 10
    assert config["look_back_period_s"] > config["metrics_interval_s"]


def test_replica_arguments_are_checked_before_anything_starts():
    assert TandemServeArgs().fixed_single_engine
    assert TandemServeArgs(autoscaling=EngineAutoscaling.parse("1:3:500")).autoscaling.target_load_tokens == 500
    with pytest.raises(ValidationError, match="engine_replicas"):
        TandemServeArgs(engine_replicas=2, autoscaling={"max_replicas": 3})
    with pytest.raises(ValidationError, match="max_replicas"):
        TandemServeArgs(autoscaling={"min_replicas": 3, "max_replicas": 2})
    with pytest.raises(ValidationError, match="engine_replicas"):
        TandemServeArgs(engine_replicas=0)
    with pytest.raises(ValueError, match="MIN:MAX"):
        EngineAutoscaling.parse("4")


def test_merged_metrics_label_every_replica_and_hold_each_family_once():
    text = (b"# HELP tandem:generation_tokens Tokens.\n# TYPE tandem:generation_tokens counter\n"
            b"tandem:generation_tokens_total 5.0\n")
    out = merge({"e/0": text, "e/1": text.replace(b"5.0", b"7.0")}).decode()
    assert out.count("# TYPE tandem:generation_tokens counter") == 1
    assert 'tandem:generation_tokens_total{replica="e/0"} 5.0' in out
    assert 'tandem:generation_tokens_total{replica="e/1"} 7.0' in out


def test_tandem_serve_takes_engine_replicas_and_autoscaling_flags(capsys):
    import argparse

    from tandem.serve import cli

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = cli.serve_args(parser.parse_args(["--autoscaling", "1:4:500", "--device", "cpu"]))
    assert (args.autoscaling.min_replicas, args.autoscaling.max_replicas, args.autoscaling.target_load_tokens) == (1, 4, 500)
    args = cli.serve_args(parser.parse_args(["--engine-replicas", "3", "--no-prefix-routing", "--device", "cpu"]))
    assert args.engine_replicas == 3 and not args.prefix_routing
    with pytest.raises(SystemExit):
        parser.parse_args(["--autoscaling", "3:2"])
    assert "max_replicas 2 is below min_replicas 3" in capsys.readouterr().err
