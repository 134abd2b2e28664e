import sys

from checkpoints_tools.cli import main

sys.exit(main())
