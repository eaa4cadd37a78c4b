"""The model: `decoder` (`ModelConfig`, `DecoderLM` from registered components), `budget` (params and
FLOPs per token without allocating), `interop` (load the reference code's attention weights).
"""
