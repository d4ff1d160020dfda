"""reprocube: bit-exact restart and resume of deep-learning training, proved and explained."""

__version__ = "0.1.0"
