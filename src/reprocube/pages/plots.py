"""matplotlib, set up once for every figure reprocube draws (report, study): files only (Agg), and no
mathtext: every text on a figure is data (run directory names, tensor names, paths), where a `$` would
start a formula and `$\\foo$` a parse error that ends the command."""

import matplotlib

matplotlib.use("Agg")
matplotlib.rcParams["text.parse_math"] = False

import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["plt"]
