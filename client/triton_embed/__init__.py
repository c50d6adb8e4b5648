"""triton-embed."""
