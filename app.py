"""SpecLens: `python app.py` serves the explorer (also the Hugging Face Spaces entry point)."""

import contextlib
import os
import threading

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

with contextlib.suppress(ImportError):  # absent outside Spaces; on ZeroGPU it comes before anything CUDA
    import spaces  # noqa: F401

from app.ui import build_demo, launch_options  # noqa: E402
from decoding.models import OFFLINE_PRESETS
from decoding.models.loading import load_model, quiet_libraries  # noqa: E402
from decoding.settings.environment import on_zerogpu  # noqa: E402


def _warm_up() -> None:
    # Load the default model while the page opens, so the first Run is quick.
    try:
        load_model(OFFLINE_PRESETS[0])
    except Exception as exc:  # the first Run reports it properly
        print(f"could not preload {OFFLINE_PRESETS[0]}: {exc}")


if __name__ == "__main__":
    quiet_libraries()
    if on_zerogpu():
        # ZeroGPU moves to each GPU call the weights placed on CUDA before launch: load them first.
        _warm_up()
    else:
        threading.Thread(target=_warm_up, daemon=True).start()
    build_demo().queue(max_size=32).launch(**launch_options())
