import sys

from kvtiers.cli import main

sys.exit(main())
