import sys

from nereus.cli import main

sys.exit(main())
