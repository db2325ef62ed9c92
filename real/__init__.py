"""rlsched.real: the live driver (Ray placement, vLLM engines, Megatron-core trainer,
sandboxed environments). Heavy libraries are imported only inside the modules that need
them; ``rlsched.real.driver`` raises one LiveBackendError line without the [live] extra."""
