"""``python -m eagle_gate.doctor``: the same as ``eagle-gate doctor``."""

import sys

from eagle_gate.doctor import main

sys.exit(main())
