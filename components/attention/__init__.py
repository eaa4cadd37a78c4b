"""Attention variants (kind `attention`) and the attention cores they share (`backends`: the
dispatch; `sdpa`: PyTorch's cores; `triton/`: our Triton kernel)."""
