"""Attention variants (kind `attention`) and the attention cores they share (`backends`)."""
