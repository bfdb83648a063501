import sys

from umjoin.cli import main

sys.exit(main())
