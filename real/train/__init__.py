"""The trainer: Megatron-core workers, the trainer lane, the policy-gradient loss, weights publishing."""
