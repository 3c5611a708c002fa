import sys

from numpy_engine.cli import main

sys.exit(main())
