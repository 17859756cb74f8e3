"""reasonrl: post-training of language models for math and code reasoning."""

__version__ = "0.1.0"
