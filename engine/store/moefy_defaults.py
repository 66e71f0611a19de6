"""The sparse default model's shape: experts per layer and experts active per token.

Apart from moefy.py, which needs MLX, so that command lines can show them in their help cheaply.
"""

DEFAULT_EXPERTS = 16
# The smallest k whose perplexity on the shipped evaluation text (data/evaluation.txt) is within 10 % of dense
# (docs/moefication.md).
DEFAULT_K = 15
