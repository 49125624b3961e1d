"""The site's one stylesheet and one script, written beside index.html: no asset comes from the network."""

CSS = """
:root { --fg: #1d232a; --dim: #6a737d; --line: #d8dee4; --bg2: #f6f8fa; --good: #1a7f37; --bad: #cf222e;
        --trained: #c8f0cf; --model: #dbe7ff; --other: #f1f1f1; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); margin: 0; }
nav { padding: 8px 20px; background: var(--bg2); border-bottom: 1px solid var(--line); }
main { padding: 8px 20px 40px; max-width: 1400px; }
footer { padding: 8px 20px; color: var(--dim); font-size: 12px; }
a { color: #0969da; text-decoration: none; } a:hover { text-decoration: underline; }
h1 { font-size: 20px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid var(--line); }
h3 { font-size: 15px; }
.dim { color: var(--dim); font-weight: normal; }
.good { color: var(--good); font-weight: 600; } .bad { color: var(--bad); }
.note { color: var(--dim); font-style: italic; }
.problem { color: var(--bad); }
table { border-collapse: collapse; margin: 8px 0; }
th, td { border: 1px solid var(--line); padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: var(--bg2); font-weight: 600; }
table.facts th { width: 160px; }
.filters { margin: 12px 0 6px; display: flex; gap: 8px; align-items: center; }
.filters input { width: 260px; padding: 4px 6px; }
pre { background: var(--bg2); border: 1px solid var(--line); padding: 8px; margin: 4px 0; white-space: pre-wrap;
      word-break: break-word; font: 12.5px/1.4 ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; }
details.long > summary { cursor: pointer; color: #0969da; margin: 4px 0; }
.diff { background: var(--bg2); border: 1px solid var(--line); padding: 8px; margin: 4px 0; overflow-x: auto;
        font: 12.5px/1.4 ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; }
.diff div { white-space: pre-wrap; word-break: break-all; min-height: 1.4em; }
.diff .add { background: #e6ffec; color: #116329; } .diff .del { background: #ffebe9; color: #82071e; }
.diff .hk { color: #8250df; background: #f3efff; } .diff .fh { font-weight: 600; }
.diff summary { cursor: pointer; white-space: pre-wrap; }
.conversation { display: flex; flex-direction: column; gap: 8px; }
.msg { border: 1px solid var(--line); border-left-width: 4px; border-radius: 4px; padding: 6px 10px; }
.msg .who, .label { font-size: 12px; font-weight: 600; text-transform: uppercase; color: var(--dim); }
.label b, .who .tag { text-transform: none; color: var(--fg); }
.role-system { border-left-color: #8c959f; } .role-user { border-left-color: #0969da; }
.role-tool { border-left-color: #bf8700; } .role-assistant { border-left-color: var(--good); }
.role-text { border-left-color: #d0d7de; }
.untrained { opacity: 0.75; }
.reasoning pre { background: #fbf8ef; } .tool-call pre { background: #fff8e5; }
.tag { display: inline-block; padding: 0 6px; border-radius: 8px; background: var(--bg2); border: 1px solid var(--line);
       text-transform: none; font-weight: normal; }
.drift { padding: 4px 8px; border-radius: 4px; background: #fff8c5; }
.tag.drift-realign, .tag.drift-fork { background: #fff8c5; border-color: #d4a72c; }
.tokens { font: 12px/1.9 ui-monospace, Menlo, Consolas, monospace; white-space: pre-wrap; word-break: break-all;
          border: 1px solid var(--line); padding: 6px; max-height: 600px; overflow: auto; }
.tk { border-radius: 2px; padding: 1px 0; margin-right: 1px; }
.tk.t { background: var(--trained); } .tk.m { background: var(--model); } .tk.o { background: var(--other); }
.tk:hover { outline: 1px solid #57606a; }
.legend .tk { padding: 1px 6px; }
"""

JS = """
(function () {
  "use strict";
  function setup() {
    var text = document.getElementById("filter-text");
    var reward = document.getElementById("filter-reward");
    var klass = document.getElementById("filter-class");
    var shown = document.getElementById("shown");
    if (!text || !reward || !klass) { return; }
    var rows = Array.prototype.slice.call(document.querySelectorAll("#attempts tr.att"));
    function apply() {
      var q = text.value.trim().toLowerCase(), r = reward.value, c = klass.value, n = 0;
      rows.forEach(function (row) {
        var task = (row.dataset.task || "").toLowerCase(), cls = row.dataset.class || "";
        var value = row.dataset.reward === "" ? NaN : parseFloat(row.dataset.reward);
        var ok = (!q || task.indexOf(q) >= 0 || cls.toLowerCase().indexOf(q) >= 0)
          && (!r || (r === "pos" ? value > 0 : value <= 0))
          && (!c || cls === c);
        row.hidden = !ok;
        if (ok) { n += 1; }
      });
      shown.textContent = n + " of " + rows.length + " attempts";
    }
    [text, reward, klass].forEach(function (el) {
      el.addEventListener("input", apply);
      el.addEventListener("change", apply);
    });
    apply();
  }
  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", setup); } else { setup(); }
})();
"""
