// SpecLens: one popover for every [data-tip] (tokens, prompt, stat cards). It opens on hover or
// focus, and a click or tap pins it until the next click elsewhere or Escape. The text is set with
// textContent, never as markup.
(() => {
  let tip = null, pinned = null;
  const box = () => {
    if (!tip) {
      tip = document.createElement("div");
      tip.id = "sl-tip";
      tip.setAttribute("role", "tooltip");
      // Inside the app's container, where the app's (scoped) CSS reaches it.
      (document.querySelector(".gradio-container .contain") || document.body).appendChild(tip);
    }
    return tip;
  };
  const show = (el) => {
    const t = box();
    t.textContent = el.dataset.tip;
    t.style.display = "block";
    const r = el.getBoundingClientRect(), w = t.offsetWidth, h = t.offsetHeight;
    const left = Math.max(8, Math.min(r.left, window.innerWidth - w - 8));
    const below = r.bottom + 6 + h < window.innerHeight;
    t.style.left = `${left}px`;
    t.style.top = `${below ? r.bottom + 6 : r.top - h - 6}px`;
  };
  const hide = () => { if (tip) tip.style.display = "none"; pinned = null; };
  const target = (e) => e.target.closest && e.target.closest("[data-tip]:not([data-tip=''])");
  document.addEventListener("mouseover", (e) => { const el = target(e); if (el && !pinned) show(el); });
  document.addEventListener("mouseout", (e) => { if (target(e) && !pinned && tip) tip.style.display = "none"; });
  document.addEventListener("focusin", (e) => { const el = target(e); if (el && !pinned) show(el); });
  document.addEventListener("click", (e) => {
    const el = target(e);
    if (el && el !== pinned) { show(el); pinned = el; tip.classList.add("sl-pinned"); }
    else { hide(); if (tip) tip.classList.remove("sl-pinned"); }
  });
  document.addEventListener("keydown", (e) => { if (e.key === "Escape") hide(); });
  document.addEventListener("scroll", () => { if (!pinned) hide(); }, true);
})();

// The race (visualize/race.py): both lanes replayed at their measured token times, slowed down
// by the chosen factor. One race at a time; Race again restarts it.
(() => {
  let timer = null;
  const play = (race) => {
    const data = JSON.parse(race.dataset.race);
    const slow = Number(race.dataset.slow || 1);
    const lanes = [...race.querySelectorAll(".sl-lane")];
    lanes.forEach((l) => { l.querySelector(".sl-lane-text").textContent = ""; l.dataset.shown = "0"; });
    const clock = race.querySelector(".sl-race-clock");
    const end = Math.max(...Object.values(data).map((lane) => (lane.length ? lane[lane.length - 1][0] : 0)));
    const start = performance.now();
    if (timer) clearInterval(timer);
    timer = setInterval(() => {
      const t = (performance.now() - start) / 1000 / slow;
      clock.textContent = `${Math.min(t, end).toFixed(2)} s` + (slow > 1 ? ` (×${slow} slower)` : "");
      race.dataset.elapsed = String((performance.now() - start) / 1000);
      for (const lane of lanes) {
        const tokens = data[lane.dataset.lane];
        let shown = Number(lane.dataset.shown);
        while (shown < tokens.length && tokens[shown][0] <= t) {
          lane.querySelector(".sl-lane-text").textContent += tokens[shown][1];
          shown += 1;
        }
        lane.dataset.shown = String(shown);
        lane.querySelector(".sl-lane-count").textContent = String(shown);
      }
      if (t >= end) { clearInterval(timer); timer = null; race.dataset.done = "1"; }
    }, 30);
    race.dataset.done = "0";
  };
  document.addEventListener("click", (e) => {
    const race = e.target.closest && e.target.closest(".sl-race");
    if (!race) return;
    if (e.target.closest(".sl-race-speed")) {
      race.dataset.slow = e.target.closest(".sl-race-speed").dataset.slow;
      race.querySelectorAll(".sl-race-speed").forEach((b) => b.classList.toggle("sl-on", b.dataset.slow === race.dataset.slow));
    }
    if (e.target.closest(".sl-race-play") || e.target.closest(".sl-race-speed")) play(race);
  });
})();
