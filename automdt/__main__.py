import sys

from automdt.cli import main

sys.exit(main())
