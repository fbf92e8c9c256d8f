import os
import sys

# Lets `pytest python/tests` find the package without PYTHONPATH when the
# in-tree build exists (scripts/test.sh sets PYTHONPATH explicitly).
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
for p in (os.path.join(_ROOT, "build", "python"), os.path.join(_ROOT, "python")):
    if os.path.isdir(p) and p not in sys.path:
        sys.path.append(p)
