"""Stubs generated from protos/shard.proto by `python -m tandem.rpc.regen`; do not edit."""
