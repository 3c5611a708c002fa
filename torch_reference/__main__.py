import sys

from torch_reference.cli import main

sys.exit(main())
