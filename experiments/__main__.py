"""``python -m automdt.experiments <experiment> [options]`` (see :mod:`automdt.experiments.run`)."""
import sys

from automdt.experiments.run import main

sys.exit(main())
