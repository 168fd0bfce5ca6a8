"""Screenshots of every tab, light and dark, desktop and phone, into docs/screenshots/.

    .venv/bin/python -m scripts.screenshots [FOLDER]

Serves the app on a free port of this machine, opens it in Debian's Chromium (Playwright), and
for each tab saves `<tab>-<theme>-<device>.png`, and `explore-step-<theme>-<device>.png`: Explore's
step-through at its first round's check stage (the target reading every guess in one pass), and
`explore-gpu-<theme>-<device>.png`: Explore's "On a GPU" section opened. The app
opens on its example run, so Explore shows a filled timeline without running a model.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

from app.ui import build_demo, launch_options

ROOT = Path(__file__).resolve().parents[1]
TABS = ("Explore", "Sweep", "Traffic", "Theory", "Replay", "Production")
VIEWPORTS = {"desktop": (1400, 900), "phone": (390, 844)}
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]


def serve() -> tuple[object, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo = build_demo().queue(max_size=32)
    options = launch_options() | {"server_name": "127.0.0.1", "server_port": port}
    demo.launch(prevent_thread_lock=True, quiet=True, **options)
    return demo, f"http://127.0.0.1:{port}/"


def open_tab(page, tab: str, phone: bool) -> None:
    if phone and page.locator(".sidebar.open").count():  # the page closes it on phones; if not, do
        page.locator(".sidebar .toggle-button").first.click()
        page.wait_for_timeout(500)
    page.get_by_role("tab", name=tab).click()  # every tab is in sight, a phone's too
    page.wait_for_timeout(1500)


def shoot_check_stage(page, path: Path, phone: bool) -> None:
    """Explore's timeline stepped to the first round's check stage."""
    open_tab(page, "Explore", phone)
    timeline = page.locator("#timeline")
    for _ in range(2):  # the draft's guesses, then the one pass that checks them
        timeline.locator(".sl-step-next").click()
    page.wait_for_timeout(500)
    timeline.screenshot(path=path)


def shoot_on_gpu(page, path: Path, phone: bool) -> None:
    """Explore's "On a GPU" section opened: the example run priced on the recorded GPUs."""
    open_tab(page, "Explore", phone)
    section = page.locator("#on-gpu")
    section.get_by_text("On a GPU").first.click()
    page.wait_for_timeout(800)
    section.scroll_into_view_if_needed()
    section.screenshot(path=path)


def shoot(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    demo, url = serve()
    saved = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=FLAGS)
            for theme in ("light", "dark"):
                for device, (width, height) in VIEWPORTS.items():
                    context = browser.new_context(viewport={"width": width, "height": height})
                    page = context.new_page()
                    page.goto(f"{url}?__theme={theme}", wait_until="load")
                    page.wait_for_selector("#run", timeout=60_000)
                    page.wait_for_timeout(3000)
                    for tab in TABS:
                        open_tab(page, tab, device == "phone")
                        name = tab.split()[0].lower().replace("-", "")
                        path = folder / f"{name}-{theme}-{device}.png"
                        page.screenshot(path=path, full_page=device == "desktop")
                        saved.append(path)
                    path = folder / f"explore-step-{theme}-{device}.png"
                    shoot_check_stage(page, path, device == "phone")
                    saved.append(path)
                    path = folder / f"explore-gpu-{theme}-{device}.png"
                    shoot_on_gpu(page, path, device == "phone")
                    saved.append(path)
                    context.close()
            browser.close()
    finally:
        demo.close()
    return saved


if __name__ == "__main__":
    for path in shoot(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "screenshots"):
        print(path)
