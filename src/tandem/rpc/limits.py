"""Message size limits shared by the shard server, its clients and the session socket."""

# Messages may carry whole prompts; the gRPC default of 4 MiB is too tight for long ones.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]
