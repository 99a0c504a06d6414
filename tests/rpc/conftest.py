"""Fixtures of the gRPC shard tests: a tiny random Llama folder, an in-process shard server,
a one-rank GrpcShardGroup on in-process servers."""
from __future__ import annotations

import grpc
import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A 2-layer random Llama (vocab 128, 4 q heads over 2 kv heads), as a model folder."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    folder = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(folder)
    return str(folder)


@pytest.fixture
def shard_server():
    """Factory: an in-process shard server -> (its stub, its address); stopped after the test."""
    from tandem.rpc.generated import shard_pb2_grpc as pb_grpc
    from tandem.rpc.server import start_shard_server
    from tandem.shard.factory import build_rank

    started = []

    def start(fault_injection: bool = False):
        server, address = start_shard_server(build_rank, "127.0.0.1:0", fault_injection=fault_injection)
        channel = grpc.insecure_channel(address)
        started.append((server, channel))
        return pb_grpc.ShardControlStub(channel), address

    yield start
    for server, channel in started:
        channel.close()
        server.stop(grace=None)


class InProcessLauncher:
    """One rank: a shard server in this process, fresh on every start."""

    def __init__(self):
        self.servers = []

    def start(self) -> list[str]:
        from tandem.rpc.server import start_shard_server
        from tandem.shard.factory import build_rank

        self.stop()
        server, address = start_shard_server(build_rank, "127.0.0.1:0")
        self.servers.append(server)
        return [address]

    def stop(self) -> None:
        for server in self.servers:
            server.stop(grace=None)
        self.servers = []


@pytest.fixture
def in_process_launcher() -> InProcessLauncher:
    launcher = InProcessLauncher()
    yield launcher
    launcher.stop()


GROUP_SLOTS, GROUP_BUDGET = 4, 12


@pytest.fixture(params=["socket", "grpc"])
def group(tiny_model_dir, request):
    """A one-rank GrpcShardGroup on an in-process server: GROUP_SLOTS slots, a row budget of
    GROUP_BUDGET; its Session stream over the rank's session socket, or over gRPC."""
    from tandem.rpc.grpc_group import GrpcShardGroup
    from tandem.shard.factory import ShardSpec

    g = GrpcShardGroup(ShardSpec(model=tiny_model_dir, num_slots=GROUP_SLOTS, max_model_len=32, row_budget=GROUP_BUDGET),
                       InProcessLauncher(), deadline_s=10, session_socket=request.param == "socket")
    assert g.session_transports == [request.param]
    yield g
    g.close()
