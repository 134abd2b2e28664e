"""``python -m checkpoints_tools``: not built yet (the checkpoint-scan issue)."""

import sys

sys.exit("checkpoints_tools: scan/fix are not implemented yet (open issue: checkpoints_tools)")
