import sys

from tessera.engine.cli import main

sys.exit(main())
