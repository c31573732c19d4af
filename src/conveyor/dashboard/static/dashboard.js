// The dashboard's one script: a "select all" box (data-select-all="NAME")
// ticks or clears every checkbox named NAME. Served as a file so the
// Content-Security-Policy can forbid inline script.
"use strict";
for (const all of document.querySelectorAll("input[data-select-all]")) {
  all.addEventListener("change", () => {
    const name = all.dataset.selectAll;
    for (const box of document.querySelectorAll(`input[name="${name}"]`)) {
      box.checked = all.checked;
    }
  });
}
