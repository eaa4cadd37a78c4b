"""ablate: declarative architecture ablations of decoder language models."""

__version__ = "0.1.0"
