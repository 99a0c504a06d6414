"""Ray actors: the scheduler actor, the GPU shard actors and the Python handle API. With tandem.serve, the only Ray-importing part of tandem."""
