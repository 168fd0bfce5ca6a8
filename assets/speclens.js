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
