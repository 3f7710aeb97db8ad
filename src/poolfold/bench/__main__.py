"""``python -m poolfold.bench``: the same as ``poolfold bench``."""

from . import main

raise SystemExit(main())
