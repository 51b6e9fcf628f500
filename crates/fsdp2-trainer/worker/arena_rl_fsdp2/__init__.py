"""The PyTorch FSDP2 trainer worker of arena-rl (`docs/trainer-protocol.md`, `arena-rl-trainer/1`)."""

PROTOCOL = "arena-rl-trainer/1"
