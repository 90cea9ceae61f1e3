"""``import lightning_srifty`` must stay light: the CLI and planner never need torch."""

from __future__ import annotations

import subprocess
import sys


def test_import_does_not_load_torch_until_the_callback_is_used() -> None:
    code = (
        "import sys, lightning_srifty\n"
        "print('torch' in sys.modules)\n"
        "cb = lightning_srifty.SriftyCallback\n"
        "print('torch' in sys.modules, cb.__name__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.split() == ["False", "True", "SriftyCallback"]


def test_unknown_attribute_is_an_attribute_error() -> None:
    import lightning_srifty

    try:
        lightning_srifty.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as err:
        assert "NoSuchThing" in str(err)
    else:
        raise AssertionError("expected AttributeError")
