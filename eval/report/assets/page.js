// rpg-eval report: the sample browser. The filters live in the address's query
// (report.html?bench=0&ckpt=3&grader=paper&correct=0&disagree=1&truncated=1&noanswer=1&page=2: indices
// into the benchmark and checkpoint menus), so a view can be bookmarked; the fragment (#samples) stays
// the page's anchors. Model output is put on the page as text (textContent), never as markup.
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("rpg-data").textContent);
  var S = D.samples, F = D.flags, N = S.c.length, PAGE = 50;
  var $ = function (id) { return document.getElementById(id); };
  var box = { bench: $("f-bench"), ckpt: $("f-ckpt"), grader: $("f-grader"), correct: $("f-correct"),
              disagree: $("f-disagree"), truncated: $("f-truncated"), noanswer: $("f-noanswer") };

  function option(select, value, text) {
    var o = document.createElement("option");
    o.value = value; o.textContent = text; select.appendChild(o);
  }
  option(box.bench, "", "all");
  D.benchmarks.forEach(function (b, i) { option(box.bench, String(i), b); });
  option(box.ckpt, "", "all");
  D.checkpoints.forEach(function (c, i) { option(box.ckpt, String(i), D.runs[c[0]] + " · " + c[1] + " (step " + c[2] + ")"); });
  D.graders.forEach(function (g) { option(box.grader, g, g); });
  var truncationKnown = 0;
  for (var k = 0; k < N; k++) { if (S.f[k] & F.truncation_known) { truncationKnown++; } }
  if (!truncationKnown) {
    box.truncated.disabled = true;
    box.truncated.parentNode.title = "records written before rpg-eval counted response tokens";
  }

  function readState() {
    var p = new URLSearchParams(location.search);
    return { bench: p.get("bench") || "", ckpt: p.get("ckpt") || "", grader: p.get("grader") || D.graders[0],
             correct: p.get("correct") || "", disagree: p.get("disagree") === "1", truncated: p.get("truncated") === "1",
             noanswer: p.get("noanswer") === "1", page: Math.max(1, parseInt(p.get("page") || "1", 10) || 1) };
  }
  function writeState(st) {
    var p = new URLSearchParams();
    ["bench", "ckpt", "correct"].forEach(function (key) { if (st[key] !== "") { p.set(key, st[key]); } });
    if (st.grader !== D.graders[0]) { p.set("grader", st.grader); }
    ["disagree", "truncated", "noanswer"].forEach(function (key) { if (st[key]) { p.set(key, "1"); } });
    if (st.page > 1) { p.set("page", String(st.page)); }
    var query = p.toString();
    history.replaceState(null, "", location.pathname + (query ? "?" + query : "") + location.hash);
    render();
  }
  function fromControls() {
    return { bench: box.bench.value, ckpt: box.ckpt.value, grader: box.grader.value, correct: box.correct.value,
             disagree: box.disagree.checked, truncated: box.truncated.checked, noanswer: box.noanswer.checked, page: 1 };
  }

  function matching(st) {
    var right = F.right[st.grader], answer = F.answer[st.grader], bench = st.bench === "" ? -1 : +st.bench;
    var ckpt = st.ckpt === "" ? -1 : +st.ckpt, out = [];
    for (var i = 0; i < N; i++) {
      var f = S.f[i];
      if (ckpt >= 0 && S.c[i] !== ckpt) { continue; }
      if (bench >= 0 && D.problems[S.p[i]][0] !== bench) { continue; }
      if (st.correct !== "" && ((f & right) ? "1" : "0") !== st.correct) { continue; }
      if (st.disagree && !(f & F.right.math_verify) === !(f & F.right.paper)) { continue; }
      if (st.truncated && !(f & F.truncated)) { continue; }
      if (st.noanswer && (f & answer)) { continue; }
      out.push(i);
    }
    return out;
  }

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) { e.className = cls; }
    if (text !== undefined) { e.textContent = text; }
    return e;
  }
  function answerText(index) { return index < 0 ? "(no answer)" : D.answers[index]; }
  function card(i) {
    var c = D.checkpoints[S.c[i]], p = D.problems[S.p[i]], f = S.f[i];
    var li = el("li"), head = el("div", "head");
    head.appendChild(el("b", "", D.runs[c[0]]));
    head.appendChild(el("span", "", c[1] + " (step " + c[2] + ")"));
    head.appendChild(el("span", "", D.benchmarks[p[0]] + " · problem " + p[1] + " · sample " + S.i[i]));
    D.graders.forEach(function (g) {
      var ok = f & F.right[g];
      head.appendChild(el("span", "badge " + (ok ? "right" : "wrong"), g + (ok ? " ✓" : " ✗")));
    });
    if (f & F.truncated) { head.appendChild(el("span", "badge", "truncated")); }
    li.appendChild(head);
    li.appendChild(el("div", "label", "prompt"));
    li.appendChild(el("pre", "prompt", p[3] === null ? "(problem text not available: see the note above)" : p[3]));
    li.appendChild(el("div", "label", "response" + ((f & F.cut) ? " (head and tail; the middle is left out)" : "")));
    li.appendChild(el("pre", "response", S.r[i]));
    var t = el("table"), hr = el("tr");
    ["", "extracted answer", "verdict"].forEach(function (h) { hr.appendChild(el("th", "", h)); });
    t.appendChild(hr);
    D.graders.forEach(function (g, gi) {
      var tr = el("tr");
      tr.appendChild(el("th", "", g));
      tr.appendChild(el("td", "answer", answerText(gi === 0 ? S.a[i] : S.b[i])));
      tr.appendChild(el("td", "", (f & F.right[g]) ? "right" : "wrong"));
      t.appendChild(tr);
    });
    var gold = el("tr");
    gold.appendChild(el("th", "", "gold"));
    var gd = el("td", "gold", p[2]);
    gd.colSpan = 2;
    gold.appendChild(gd);
    t.appendChild(gold);
    li.appendChild(t);
    return li;
  }
  function pager(target, st, pages) {
    target.textContent = "";
    if (pages <= 1) { return; }
    [["« first", 1], ["‹ previous", st.page - 1], ["next ›", st.page + 1], ["last »", pages]].forEach(function (b) {
      var button = el("button", "", b[0]);
      button.type = "button";
      button.disabled = b[1] < 1 || b[1] > pages || b[1] === st.page;
      button.onclick = function () { st.page = b[1]; writeState(st); };
      target.appendChild(button);
    });
    target.appendChild(el("span", "", " page " + st.page + " of " + pages));
  }

  function render() {
    var t0 = performance.now(), st = readState();
    box.bench.value = st.bench; box.ckpt.value = st.ckpt; box.grader.value = st.grader; box.correct.value = st.correct;
    box.disagree.checked = st.disagree; box.truncated.checked = st.truncated; box.noanswer.checked = st.noanswer;
    var hits = matching(st), pages = Math.max(1, Math.ceil(hits.length / PAGE));
    st.page = Math.min(st.page, pages);
    var first = (st.page - 1) * PAGE, shown = hits.slice(first, first + PAGE), list = $("sample-list");
    list.textContent = "";
    var frag = document.createDocumentFragment();
    shown.forEach(function (i) { frag.appendChild(card(i)); });
    list.appendChild(frag);
    var count = $("count");
    count.dataset.matching = String(hits.length);
    count.dataset.shown = String(shown.length);
    count.textContent = hits.length ? ("Samples " + (first + 1) + "–" + (first + shown.length) + " of " +
      hits.length.toLocaleString("en") + " matching (" + N.toLocaleString("en") + " in all)") :
      ("No sample matches (" + N.toLocaleString("en") + " in all)");
    pager($("pager-top"), st, pages);
    pager($("pager"), st, pages);
    document.body.dataset.renderMs = (performance.now() - t0).toFixed(1);
    document.body.dataset.readyMs = performance.now().toFixed(1);
  }

  Object.keys(box).forEach(function (key) { box[key].addEventListener("change", function () { writeState(fromControls()); }); });
  window.addEventListener("popstate", render);
  render();
})();
