"""Apply the engine image's patch series in the image build: sparkfold's own applier, unchanged.

Usage: python3 apply_series.py SERIES_FILE TREE. Prints each patch and what happened to it; a patch
that does not apply fails the build with its name (and nothing of the series is written).
"""

import sys

from sparkfold_patches import PatchError, apply_series, read_series

try:
    steps = apply_series(read_series(sys.argv[1]), sys.argv[2])
except PatchError as exc:
    sys.exit(f"sparkfold image: the patch series does not apply: {exc}")
for step in steps:
    print(f"sparkfold image: {step.name}: {step.state}")
print(f"sparkfold image: {len(steps)} patch(es) in the series")
