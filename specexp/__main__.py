import sys

from specexp.cli import main

sys.exit(main())
