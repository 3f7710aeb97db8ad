"""A pytest plugin (``-p fuzz.few_examples``) that caps every hypothesis test at
``POOLFOLD_MAX_EXAMPLES`` examples (default 10), whatever its own settings say: the
bounds-checked run repeats the property tests to catch out-of-bounds accesses, not to search
as widely as the normal run does."""

from __future__ import annotations

import os

from hypothesis import settings


def pytest_collection_modifyitems(items):
    cap = int(os.environ.get("POOLFOLD_MAX_EXAMPLES", "10"))
    for item in items:
        function = getattr(item, "obj", None)
        own = getattr(function, "_hypothesis_internal_use_settings", None)
        if own is not None:
            function._hypothesis_internal_use_settings = settings(
                own, max_examples=min(own.max_examples, cap))
