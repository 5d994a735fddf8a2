"""`python -m timelyllm_ros.cli ...` is the `timelyllm` command."""

import sys

from timelyllm_ros.cli.main import main

sys.exit(main())
