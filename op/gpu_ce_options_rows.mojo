"""Where callers found the extended options' launch sequence: it is
`launch_cross_entropy` of gpu_cross_entropy with `n_options` (the one
dispatch), `launch_cross_entropy_options` its form with `n_options` before
the rows."""

from .gpu_cross_entropy import launch_cross_entropy_options
