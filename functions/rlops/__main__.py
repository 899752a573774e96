import sys

from rlops.cli import main

sys.exit(main())
