"""``plugins.import_location``: a ``.py`` file named by a recipe (tools, rewards, agents) is loaded
once, and no thread sees it before its body has run."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from astraflow.plugins import import_location


def test_threads_loading_one_file_all_see_its_functions(tmp_path):
    # A body slow enough that, without the lock, the second thread finds the module in
    # sys.modules before `hint` is defined (what failed a tool-env run in CI).
    src = tmp_path / "slow_tools.py"
    src.write_text(
        "import time\nLOADS = globals().setdefault('LOADS', 0) + 1\ntime.sleep(0.2)\n"
        "def hint():\n    return 'sum'\n"
    )

    def load(_):
        module = import_location(str(src), "test_race")
        return module, hasattr(module, "hint")  # what the caller sees the moment it returns

    with ThreadPoolExecutor(8) as pool:
        loaded = list(pool.map(load, range(8)))
    assert all(complete for _, complete in loaded)
    assert all(m is loaded[0][0] for m, _ in loaded)
    assert loaded[0][0].LOADS == 1  # executed once


def test_a_file_that_fails_is_not_left_half_loaded(tmp_path):
    src = tmp_path / "broken_tools.py"
    src.write_text("raise RuntimeError('boom')\n")
    for _ in range(2):  # the second attempt runs the body again instead of finding a husk
        with pytest.raises(RuntimeError, match="boom"):
            import_location(str(src), "test_broken")
