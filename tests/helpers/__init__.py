"""What several test modules share: the real configs composed, tiny checkpoints, volumes and sweep folders written
as medseg writes them, the metric references written from their formulas. Fixtures live in the conftest.py files."""

import pytest

# the asserts of assert_same_geometry and check_run_outputs report their values, as in test modules
pytest.register_assert_rewrite("tests.helpers.runs", "tests.helpers.volumes")
