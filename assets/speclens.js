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
  let noteUntil = 0;
  const show = (el, text = el.dataset.tip) => {
    const t = box();
    t.textContent = text;
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
    else if (performance.now() > noteUntil) { hide(); if (tip) tip.classList.remove("sl-pinned"); }
  });
  // A slider's number box moves a typed value past its ends to the nearest end when it loses the
  // focus (Gradio does, silently): say so beside it, pinned, so k = 0 does not quietly become 1.
  // (blur in the capture phase: before the box's own blur handler moves the value)
  document.addEventListener("blur", (e) => {
    const input = e.target;
    if (!input.matches || !input.matches('input[data-testid="number-input"]') || input.value === "") return;
    const [value, low, high] = [input.value, input.min, input.max].map(Number);
    if (!(value < low || value > high)) return;
    const name = (input.getAttribute("aria-label") || "").replace(/^number input for /, "");
    show(input, `${name}: ${value} is outside ${low}–${high}, so it is set to ${value < low ? low : high}.`);
    pinned = input;
    tip.classList.add("sl-pinned");
    noteUntil = performance.now() + 500;  // the click that took the focus away leaves it on show
  }, true);
  document.addEventListener("keydown", (e) => { if (e.key === "Escape") hide(); });
  document.addEventListener("scroll", () => { if (!pinned) hide(); }, true);
})();

// A draft copied from the prompt (visualize/timeline.py's data-copy, data-key: 1-based positions):
// a click marks in the prompt the tokens it copied and those it matched before them, unfolds the
// chat template where they lie, and scrolls the prompt to them.
(() => {
  const within = (spec, pos) => { const [a, b] = (spec || "").split("-").map(Number); return pos >= a && pos <= b; };
  document.addEventListener("click", (e) => {
    const chip = e.target.closest && e.target.closest(".sl-tok[data-copy]");
    const timeline = chip && chip.closest(".sl-timeline");
    const prompt = timeline && timeline.querySelector("div.sl-prompt");
    if (!prompt) return;
    prompt.querySelectorAll("[data-pos]").forEach((t) => {
      const pos = Number(t.dataset.pos);
      const mark = within(chip.dataset.copy, pos) ? "sl-match-copy" : within(chip.dataset.key, pos) ? "sl-match-key" : "";
      t.classList.remove("sl-match-key", "sl-match-copy");
      if (!mark) return;
      t.classList.add(mark);
      const fold = t.closest("details");
      if (fold) fold.open = true;
    });
    const first = prompt.querySelector(".sl-match-copy");
    if (!first) return;
    // Only the prompt's box and the rounds' box scroll: the page, and the popover, stay put.
    const box = first.closest(".sl-tok.sl-prompt");
    if (box) box.scrollTop += first.getBoundingClientRect().top - box.getBoundingClientRect().top - 4;
    const rounds = prompt.closest(".sl-rounds");
    const above = rounds && prompt.getBoundingClientRect().top - rounds.getBoundingClientRect().top;
    if (rounds && above < 0) rounds.scrollTop += above;
  });
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
// by the chosen factor, then the line that says who finished first. One race at a time; Race
// again restarts it.
(() => {
  let timer = null;
  const play = (race) => {
    const data = JSON.parse(race.dataset.race);
    const slow = Number(race.dataset.slow || 1);
    const lanes = [...race.querySelectorAll(".sl-lane")];
    lanes.forEach((l) => { l.querySelector(".sl-lane-text").textContent = ""; l.dataset.shown = "0"; });
    const finish = race.querySelector(".sl-race-end");
    if (finish) finish.hidden = true;
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
      if (t >= end) {
        clearInterval(timer); timer = null; race.dataset.done = "1";
        if (finish) finish.hidden = false;  // who finished first, once both have
      }
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

// Step-through (visualize/timeline.py's STEPPER): each round built up stage by stage. A round that
// drafted has four: "draft", its guesses shown, none judged; "check", the target reading them all
// in one pass, its measured time beside k + 1 plain steps (the round's data-check, its .sl-pass);
// "verdicts", every verdict of that one pass at once (data-verdicts); "own", the target's own
// token. A round that drafted nothing has "own" alone. The round's sentence (in its row, and the
// view below that tells the chosen round) shows only once its last stage does.
// ←/→ step whenever no control that takes typing or arrows has focus; space on the play button plays.
// A timeline and its round slider (Explore's "Explain round", Replay's "Round") share one round:
// a step into another round moves the slider, the server explains that round and sends the timeline
// again, and the step-through carries on in it from where it was; moving the slider by hand steps
// to that round.
(() => {
  let timer = null, lastHost = null;
  const SLIDER = { timeline: "round", "replay-timeline": "replay-round" };  // a timeline's elem_id -> its round slider's
  const SENTENCE = { timeline: "sentence", "replay-timeline": "replay-sentence" };  // -> the view telling that round
  const kept = {};  // elem_id -> the stage a step-through is at, while one is on
  const OWN = { "sl-correction": "the target's own token, in place of the refused one", "sl-bonus": "the target's bonus token: every guess was kept", "sl-target": "the target alone: nothing was drafted, so it wrote one token itself" };
  const kindOf = (chip, names) => Object.keys(names).find((k) => chip.classList.contains(k));
  const hostOf = (tl) => { const h = tl.closest(".block[id]"); return h ? h.id : null; };  // the Gradio component
  const timelineIn = (host) => document.querySelector(`#${host} .sl-timeline`);
  const slider = (host) => SLIDER[host] && document.querySelector(`#${SLIDER[host]} input[type=range]`);
  const roundStages = (r) => {
    const own = r.querySelector('[data-step="emit"]') ? ["own"] : [];
    return r.querySelector('[data-step="draft"]') ? ["draft", "check", "verdicts", ...own] : own;
  };
  const stages = (tl) => {
    const out = [];
    tl.querySelectorAll(".sl-round").forEach((r, i) => roundStages(r).forEach((s) => out.push([i, s])));
    return out;
  };
  const describe = (round, stage, total, index) => {
    const drafts = round.querySelectorAll('[data-step="draft"]').length;
    // A tree round's chips are its main line (the kept path, then the best refused child).
    const nodes = round.dataset.treeNodes;
    let what;
    if (stage === "draft" && nodes) what = `the draft proposes a tree of ${nodes} tokens; its main line holds ${drafts}`;
    else if (stage === "draft") what = `the draft proposes ${drafts} token${drafts === 1 ? "" : "s"}, none checked yet`;
    else if (stage === "check") what = round.dataset.check;
    else if (stage === "verdicts") what = round.dataset.verdicts;
    else what = OWN[kindOf(round.querySelector('[data-step="emit"]'), OWN)] || "the target's own token";
    return `Round ${index + 1} of ${total}: ${what}`;
  };
  // The slider moves as a hand would move it, so Gradio sends the change to the server.
  const follow = (host, round) => {
    const range = slider(host);
    if (!range || Number(range.value) === round + 1 || round + 1 > Number(range.max)) return;
    range.value = String(round + 1);
    range.dispatchEvent(new Event("input", { bubbles: true }));
  };
  // The view below that tells the chosen round waits, like the row's own sentence, for its last stage.
  const holdSentence = (host, hold) => {
    const view = SENTENCE[host] && document.getElementById(SENTENCE[host]);
    if (view) view.toggleAttribute("data-sl-held", hold);
  };
  // Only the rounds' box scrolls to the round: the page (and a slider under the pointer) stays put.
  const bringIntoView = (tl, round) => {
    const box = tl.querySelector(".sl-rounds");
    if (!box) return;
    const r = round.getBoundingClientRect(), b = box.getBoundingClientRect();
    if (r.bottom > b.bottom) box.scrollTop += Math.min(r.bottom - b.bottom, r.top - b.top);
    else if (r.top < b.top) box.scrollTop -= b.top - r.top;
  };
  const render = (tl, pos) => {
    const list = stages(tl);
    if (!list.length) return;
    pos = Math.max(0, Math.min(pos, list.length - 1));
    tl.dataset.pos = String(pos);
    tl.classList.add("sl-stepping");
    const [at, stage] = list[pos];
    const told = pos === list.length - 1 || list[pos + 1][0] !== at;  // the round's last stage
    const rounds = [...tl.querySelectorAll(".sl-round")];
    rounds.forEach((r, i) => {
      const now = i === at;
      r.classList.toggle("sl-future", i > at);
      r.classList.toggle("sl-step-current", now);
      r.classList.toggle("sl-checked", now && stage !== "draft");
      r.classList.toggle("sl-reading", now && stage === "check");
      r.classList.toggle("sl-told", now && told);
      r.querySelectorAll('[data-step="draft"]').forEach((c) => c.classList.toggle("sl-pending", now && (stage === "draft" || stage === "check")));
      r.querySelectorAll('[data-step="emit"]').forEach((c) => c.classList.toggle("sl-unseen", now && stage !== "own"));
    });
    bringIntoView(tl, rounds[at]);
    tl.querySelector(".sl-step-where").textContent = describe(rounds[at], stage, rounds.length, at);
    const host = hostOf(tl);
    if (host) { lastHost = host; kept[host] = { pos, at }; holdSentence(host, !told); follow(host, at); }
    if (pos === list.length - 1) pause(tl);
  };
  const playLabel = (tl, playing) => {
    const play = tl.querySelector(".sl-step-play");
    if (!play) return;
    play.textContent = playing ? "⏸ Pause" : "▶ Play";
    play.setAttribute("aria-label", playing ? "pause" : "play");
  };
  const pause = (tl) => {
    if (timer) clearInterval(timer);
    timer = null;
    playLabel(tl, false);
  };
  const showAll = (tl) => {
    pause(tl);
    const host = hostOf(tl);
    if (host) { delete kept[host]; holdSentence(host, false); }
    tl.classList.remove("sl-stepping");
    delete tl.dataset.pos;
    const marks = ["sl-future", "sl-pending", "sl-unseen", "sl-step-current", "sl-checked", "sl-reading", "sl-told", "sl-later"];
    tl.querySelectorAll(marks.map((m) => `.${m}`).join(", ")).forEach((el) => el.classList.remove(...marks));
    tl.querySelector(".sl-step-where").textContent = "";
    tl.querySelector(".sl-step-play").textContent = "▶ Step through";
  };
  const step = (tl, by) => render(tl, tl.dataset.pos === undefined ? 0 : Number(tl.dataset.pos) + by);
  // The timeline a tick or a key acts on: the same one, or the one the server sent in its place.
  const live = (tl) => (tl.isConnected ? tl : (tl.dataset.host && timelineIn(tl.dataset.host)) || null);
  const play = (tl) => {
    if (timer) return pause(tl);
    const speed = Number(tl.querySelector(".sl-step-speed").value || 1);
    if (tl.dataset.pos === undefined || Number(tl.dataset.pos) >= stages(tl).length - 1) render(tl, 0);
    playLabel(tl, true);
    tl.dataset.host = hostOf(tl) || "";
    timer = setInterval(() => {
      const now = live(tl);
      if (!now || now.dataset.pos === undefined) return pause(tl);
      now.dataset.host = tl.dataset.host;
      tl = now;
      step(tl, 1);
    }, 900 / speed);
  };
  // A timeline the server sent again: the step-through carries on where it was, or, when the
  // slider was moved by hand, at that round; a new run's timeline (nothing selected) starts afresh.
  const resume = () => {
    for (const host of Object.keys(kept)) {
      const tl = timelineIn(host);
      if (!tl || tl.dataset.pos !== undefined || !tl.querySelector(".sl-stepper")) continue;
      const selected = tl.querySelector(".sl-round.sl-selected");
      if (!selected) { delete kept[host]; holdSentence(host, false); continue; }
      const range = slider(host);
      const round = range ? Number(range.value) - 1 : Number(selected.dataset.round);
      const { pos, at } = kept[host];
      render(tl, at === round ? pos : stages(tl).findIndex(([i]) => i === round));
      if (timer) playLabel(tl, true);
    }
  };
  new MutationObserver(() => { if (Object.keys(kept).length) resume(); }).observe(document.documentElement, { childList: true, subtree: true });
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
  // Controls that take typing or use the arrows themselves keep them.
  const OWN_ARROWS = "input:not([type=checkbox]):not([type=button]):not([type=submit]), textarea, select, [contenteditable]:not([contenteditable=false]), [role=slider], [role=listbox], [role=combobox]";
  const shown = (tl) => tl.getClientRects().length > 0 && tl.querySelector(".sl-stepper");
  const keyed = () => {
    const active = document.activeElement;
    const inside = active && active.closest && active.closest(".sl-timeline");
    if (inside && shown(inside)) return inside;
    const last = lastHost && timelineIn(lastHost);
    if (last && shown(last)) return last;
    return [...document.querySelectorAll(".sl-timeline")].find(shown) || null;
  };
  document.addEventListener("keydown", (e) => {
    if (!["ArrowLeft", "ArrowRight"].includes(e.key) || e.altKey || e.ctrlKey || e.metaKey || e.shiftKey) return;
    const active = document.activeElement;
    if (active && active.matches && active.matches(OWN_ARROWS)) return;
    const tl = keyed();
    if (!tl) return;
    e.preventDefault();
    pause(tl);
    step(tl, e.key === "ArrowRight" ? 1 : -1);
  });
})();
