"""`python -m meshpilot.iptables ARGS`: istio-iptables' argv, unchanged."""

import sys

from meshpilot.iptables.command import main

sys.exit(main())
