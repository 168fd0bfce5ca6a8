// SpecLens: one popover for every [data-tip] (tokens, prompt, stat cards, glossary terms, table headers). It opens on hover or
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

// Table headers: each column named in the glossary (visualize/glossary.py, handed over as
// window.SL_GLOSSARY) gets its definition as a data-tip, so the popover above opens on it too.
// Gradio renders a table's headers itself, with the column's name as their title.
(() => {
  let queued = false;
  const mark = () => {
    queued = false;
    const glossary = window.SL_GLOSSARY || {};
    document.querySelectorAll("th[title]:not([data-tip])").forEach((th) => {
      const text = glossary[th.getAttribute("title").trim().toLowerCase()];
      if (!text) return;
      th.dataset.tip = text;
      th.removeAttribute("title"); // the browser's own tooltip would stand over the popover
      th.setAttribute("tabindex", "0");
    });
  };
  new MutationObserver(() => {
    if (!queued) { queued = true; requestAnimationFrame(mark); }
  }).observe(document.documentElement, { childList: true, subtree: true });
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

// Step-through (visualize/timeline.py's STEPPER): each round built up stage by stage. A round's
// stages: 0, its draft's tokens shown, none judged yet; j, the first j judged; then the target's
// own token. A round that drafted nothing has the last stage alone. ←/→ step, space plays.
(() => {
  let timer = null;
  const VERDICT = { "sl-accepted": "kept", "sl-rejected": "refused: the target would have written another token", "sl-discarded": "never judged: it came after a refusal" };
  const OWN = { "sl-correction": "the target's own token, in place of the refused one", "sl-bonus": "the target's bonus token: every draft was kept", "sl-target": "the target alone: nothing was drafted" };
  const kindOf = (chip, names) => Object.keys(names).find((k) => chip.classList.contains(k));
  const stages = (tl) => {
    const out = [];
    tl.querySelectorAll(".sl-round").forEach((r, i) => {
      const drafts = r.querySelectorAll('[data-step="draft"]').length;
      if (drafts) for (let s = 0; s <= drafts; s++) out.push([i, s]);
      if (r.querySelector('[data-step="emit"]')) out.push([i, drafts + 1]);
    });
    return out;
  };
  const describe = (round, s, total, index) => {
    const drafts = [...round.querySelectorAll('[data-step="draft"]')];
    let what;
    if (s === 0) what = `the draft proposes ${drafts.length} token${drafts.length === 1 ? "" : "s"}`;
    else if (s <= drafts.length) what = `token ${s} of ${drafts.length}: ${VERDICT[kindOf(drafts[s - 1], VERDICT)] || "judged"}`;
    else what = OWN[kindOf(round.querySelector('[data-step="emit"]'), OWN)] || "the target's own token";
    return `Round ${index + 1} of ${total}: ${what}`;
  };
  const render = (tl, pos) => {
    const list = stages(tl);
    if (!list.length) return;
    pos = Math.max(0, Math.min(pos, list.length - 1));
    tl.dataset.pos = String(pos);
    tl.classList.add("sl-stepping");
    const [at, s] = list[pos];
    const rounds = [...tl.querySelectorAll(".sl-round")];
    rounds.forEach((r, i) => {
      r.classList.toggle("sl-future", i > at);
      r.classList.toggle("sl-step-current", i === at);
      const drafts = r.querySelectorAll('[data-step="draft"]');
      drafts.forEach((c, j) => c.classList.toggle("sl-pending", i === at && j >= s));
      r.querySelectorAll('[data-step="emit"]').forEach((c) => c.classList.toggle("sl-unseen", i === at && s <= drafts.length));
    });
    rounds[at].scrollIntoView({ block: "nearest" });
    tl.querySelector(".sl-step-where").textContent = describe(rounds[at], s, rounds.length, at);
    if (pos === list.length - 1) pause(tl);
  };
  const pause = (tl) => {
    if (timer) clearInterval(timer);
    timer = null;
    const play = tl.querySelector(".sl-step-play");
    if (play) { play.textContent = "▶ Play"; play.setAttribute("aria-label", "play"); }
  };
  const showAll = (tl) => {
    pause(tl);
    tl.classList.remove("sl-stepping");
    delete tl.dataset.pos;
    tl.querySelectorAll(".sl-future, .sl-pending, .sl-unseen, .sl-step-current").forEach((el) => el.classList.remove("sl-future", "sl-pending", "sl-unseen", "sl-step-current"));
    tl.querySelector(".sl-step-where").textContent = "";
    tl.querySelector(".sl-step-play").textContent = "▶ Step through";
  };
  const step = (tl, by) => render(tl, tl.dataset.pos === undefined ? 0 : Number(tl.dataset.pos) + by);
  const play = (tl) => {
    if (timer) return pause(tl);
    const speed = Number(tl.querySelector(".sl-step-speed").value || 1);
    if (tl.dataset.pos === undefined || Number(tl.dataset.pos) >= stages(tl).length - 1) render(tl, 0);
    const button = tl.querySelector(".sl-step-play");
    button.textContent = "⏸ Pause";
    button.setAttribute("aria-label", "pause");
    timer = setInterval(() => (tl.isConnected ? step(tl, 1) : pause(tl)), 900 / speed);
  };
  document.addEventListener("click", (e) => {
    const tl = e.target.closest && e.target.closest(".sl-timeline");
    if (!tl || !e.target.closest(".sl-stepper button")) return;
    if (e.target.closest(".sl-step-play")) play(tl);
    else if (e.target.closest(".sl-step-all")) showAll(tl);
    else { pause(tl); step(tl, e.target.closest(".sl-step-next") ? 1 : -1); }
  });
  document.addEventListener("change", (e) => {
    const tl = e.target.closest && e.target.closest(".sl-timeline");
    if (tl && e.target.matches(".sl-step-speed") && timer) { pause(tl); play(tl); }
  });
  document.addEventListener("keydown", (e) => {
    const tl = document.activeElement && document.activeElement.closest && document.activeElement.closest(".sl-timeline");
    if (!tl || !tl.querySelector(".sl-stepper") || !["ArrowLeft", "ArrowRight"].includes(e.key)) return;
    e.preventDefault();
    pause(tl);
    step(tl, e.key === "ArrowRight" ? 1 : -1);
  });
})();
