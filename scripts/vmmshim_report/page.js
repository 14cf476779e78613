(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("vmmshim-data").textContent);
  var NS = "http://www.w3.org/2000/svg";
  function el(tag, attrs, parent, text) {
    var e = document.createElementNS(NS, tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  var UNITS = [["PiB", 1125899906842624], ["TiB", 1099511627776], ["GiB", 1073741824], ["MiB", 1048576],
               ["KiB", 1024]];
  function fmtBytes(n) {
    for (var i = 0; i < UNITS.length; i++) if (n >= UNITS[i][1]) return (n / UNITS[i][1]).toFixed(2) + " " + UNITS[i][0];
    return Math.round(n) + " B";
  }
  // The byte axis: ticks from 0 to the first at or above vmax, a round step apart (1, 2, 2.5 or 5
  // times a power of ten of the largest binary unit vmax reaches), at most 5 steps; labels in
  // that unit with no trailing zeros ("0 B", "2.5 GiB", "5 GiB").
  function byteTicks(vmax) {
    var unit = ["B", 1];
    for (var i = 0; i < UNITS.length; i++) if (vmax >= UNITS[i][1]) { unit = UNITS[i]; break; }
    var raw = vmax / unit[1] / 5, p = Math.pow(10, Math.floor(Math.log10(raw))), step = 10 * p;
    var ms = unit[1] === 1 ? [1, 2, 5] : [1, 2, 2.5, 5];  // no fractions of a byte
    for (i = 0; i < ms.length; i++) if (ms[i] * p >= raw - 1e-12 * raw) { step = ms[i] * p; break; }
    if (unit[1] === 1) step = Math.max(1, Math.round(step));
    var n = Math.max(1, Math.ceil(vmax / unit[1] / step - 1e-9)), out = [];
    for (i = 0; i <= n; i++) {
      var v = i * step;
      out.push([v * unit[1], i ? parseFloat(v.toFixed(6)) + " " + unit[0] : "0 B"]);
    }
    return out;
  }
  function decimals(span) {
    var step = span / 4 / 1e9;
    if (!(step > 0)) return 3;
    return Math.max(0, Math.min(9, Math.ceil(-Math.log10(step)) + 1));
  }
  function fmtT(t, d) { return (t / 1e9).toFixed(d) + " s"; }
  // The time axis: ticks at whole multiples of a round step (1, 2, 2.5 or 5 times a power of ten)
  // between t0 and t1, about five, all labelled in one unit: the largest that t1 reaches
  // ("8 ms", "10 ms", "12 ms"; "0 s", "0.5 s", "1 s").
  var TUNITS = [["s", 1e9], ["ms", 1e6], ["\u00b5s", 1e3], ["ns", 1]];
  function timeTicks(t0, t1) {
    var unit = TUNITS[TUNITS.length - 1];
    for (var i = 0; i < TUNITS.length; i++) if (t1 >= TUNITS[i][1]) { unit = TUNITS[i]; break; }
    var raw = (t1 - t0) / unit[1] / 5, p = Math.pow(10, Math.floor(Math.log10(raw))), step = 10 * p;
    var ms = unit[1] === 1 ? [1, 2, 5] : [1, 2, 2.5, 5];  // no fractions of a nanosecond
    for (i = 0; i < ms.length; i++) if (ms[i] * p >= raw * (1 - 1e-9)) { step = ms[i] * p; break; }
    if (unit[1] === 1) step = Math.max(1, Math.round(step));
    var k0 = Math.ceil(t0 / unit[1] / step - 1e-9), k1 = Math.floor(t1 / unit[1] / step + 1e-9), out = [];
    for (var k = k0; k <= k1; k++) out.push([k * step * unit[1], parseFloat((k * step).toPrecision(12)) + " " + unit[0]]);
    return out;
  }

  // ---------------------------------------------------------------- timeline
  var W = 1000, X0 = 80, X1 = 980, YT = 20, YB = 240, LANE0 = 268, LANEH = 11;
  var OPCOL = ["#9c755f", "#e15759", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#bab0ac"];
  var view = [0, D.tmax];
  var drag = null;
  var lanes = [];
  (function () {
    var seen = {};
    for (var i = 0; i < D.vmm.length; i++) seen[D.vmm[i][1]] = 1;
    for (var op = 0; op < 16; op++) if (seen[op]) lanes.push(op);
  })();
  var H = D.native && lanes.length ? LANE0 + lanes.length * LANEH + 6 : 270;

  function drawTimeline(t0, t1) {
    var svg = document.getElementById("chart-timeline");
    if (!svg) return;
    if (!(t1 > t0)) t1 = t0 + 1;
    view = [t0, t1];
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    svg.setAttribute("viewBox", "0 0 " + W + " " + H);  // the page gives the width, the height follows
    svg.setAttribute("data-t0", Math.round(t0));
    svg.setAttribute("data-t1", Math.round(t1));
    var pts = D.series;
    var sx = function (t) { return X0 + (X1 - X0) * (t - t0) / (t1 - t0); };
    var prev = [t0, 0, 0], vis = [];
    for (var i = 0; i < pts.length; i++) {
      var p = pts[i];
      if (p[0] <= t0) prev = p; else if (p[0] <= t1) vis.push(p); else break;
    }
    var ymax = Math.max(1, prev[1], D.native ? prev[2] : 0);
    for (i = 0; i < vis.length; i++) ymax = Math.max(ymax, vis[i][1], D.native ? vis[i][2] : 0);
    var ticks = byteTicks(ymax);
    ymax = ticks[ticks.length - 1][0];
    var sy = function (v) { return YB - (YB - YT) * v / ymax; };
    el("line", {x1: X0, y1: YB, x2: X1, y2: YB, stroke: "#333"}, svg);
    el("line", {x1: X0, y1: YB, x2: X0, y2: YT, stroke: "#333"}, svg);
    for (i = 0; i < ticks.length; i++) {
      var y = sy(ticks[i][0]);
      el("line", {x1: X0, y1: y, x2: X1, y2: y, stroke: "#ddd"}, svg);
      el("text", {x: X0 - 4, y: y + 4, "font-size": 11, "text-anchor": "end"}, svg, ticks[i][1]);
    }
    var d = decimals(t1 - t0), xt = timeTicks(t0, t1);
    for (i = 0; i < xt.length; i++) {
      var xx = sx(xt[i][0]);
      el("line", {x1: xx, y1: YB, x2: xx, y2: YB + 4, stroke: "#333"}, svg);
      // one that ends near the plot's edge is drawn inside it: centred there it would be cut
      el("text", {x: xx, y: YB + 16, "font-size": 11, "text-anchor": xx > X1 - 20 ? "end" : xx < X0 + 20 ? "start" :
                  "middle", "class": "xlabel"}, svg, xt[i][1]);
    }
    drawSleeps(svg, t0, t1, sx);
    var series = D.native ? [[2, "#59a14f"], [1, "#4e79a7"]] : [[1, "#4e79a7"]];
    for (var s = 0; s < series.length; s++) {
      var idx = series[s][0], col = series[s][1];
      var v = prev[idx];
      var path = [sx(t0).toFixed(1) + "," + YB, sx(t0).toFixed(1) + "," + sy(v).toFixed(1)];
      for (i = 0; i < vis.length; i++) {
        var x = sx(vis[i][0]).toFixed(1);
        path.push(x + "," + sy(v).toFixed(1));
        v = vis[i][idx];
        path.push(x + "," + sy(v).toFixed(1));
      }
      path.push(sx(t1).toFixed(1) + "," + sy(v).toFixed(1), sx(t1).toFixed(1) + "," + YB);
      el("polygon", {points: path.join(" "), fill: col, "fill-opacity": 0.45, stroke: col, "stroke-width": 1.5,
                     "class": "series"}, svg);
    }
    for (i = 0; i < bandLabels.length; i++) svg.appendChild(bandLabels[i]);  // over the series, readable
    el("rect", {x: X1 - 140, y: YT, width: 12, height: 12, fill: "#4e79a7"}, svg);
    el("text", {x: X1 - 124, y: YT + 11, "font-size": 12}, svg, "live");
    if (D.native) {
      el("rect", {x: X1 - 80, y: YT, width: 12, height: 12, fill: "#59a14f"}, svg);
      el("text", {x: X1 - 64, y: YT + 11, "font-size": 12}, svg, "mapped");
      var laneOf = {};
      for (i = 0; i < lanes.length; i++) {
        laneOf[lanes[i]] = i;
        var ly = LANE0 + i * LANEH;
        el("text", {x: X0 - 4, y: ly + 8, "font-size": 9, "text-anchor": "end"}, svg, D.ops[lanes[i]] || ("op " + lanes[i]));
        el("line", {x1: X0, y1: ly + 9.5, x2: X1, y2: ly + 9.5, stroke: "#eee"}, svg);
      }
      var shown = 0;
      for (i = 0; i < D.vmm.length; i++) {
        var m = D.vmm[i];
        if (m[0] < t0 || m[0] > t1 || laneOf[m[1]] === undefined) continue;  // (an op of a newer writer: no lane)
        var name = D.ops[m[1]] || ("op " + m[1]);
        var host = m[6] & 0x80, r = el("rect", {x: (sx(m[0]) - 1).toFixed(1), y: LANE0 + laneOf[m[1]] * LANEH,
                                                width: 3, height: 9, fill: host ? "#17becf" : OPCOL[m[1] % OPCOL.length],
                                                "class": "vmm"}, svg);
        if (m[5]) { r.setAttribute("stroke", "#000"); r.setAttribute("stroke-width", 1); }
        el("title", {}, r, name + (host ? " of host memory" : m[6] & 0x40 ? " (a second mapping)" : "") + " " +
           fmtBytes(m[2]) + (m[3] ? " at 0x" + m[3].toString(16) : "") +
           ", " + (m[4] / 1e6).toFixed(3) + " ms, at " + fmtT(m[0], 6) + (m[5] ? ", FAILED (CUresult " + m[5] + ")" : ""));
        shown++;
      }
      svg.setAttribute("data-vmm-shown", shown);
    }
    var sel = el("rect", {id: "timeline-selection", x: 0, y: YT, width: 0, height: YB - YT, fill: "#4e79a7",
                          "fill-opacity": 0.2, stroke: "#4e79a7", visibility: "hidden"}, svg);
    var ov = el("rect", {id: "timeline-overlay", x: X0, y: YT, width: X1 - X0, height: YB - YT, fill: "#000",
                         "fill-opacity": 0, style: "cursor:crosshair"}, svg);
    ov.addEventListener("mousedown", function (ev) {
      drag = clampX(svgX(ev));
      sel.setAttribute("x", drag); sel.setAttribute("width", 0); sel.setAttribute("visibility", "visible");
      ev.preventDefault();
    });
    ov.addEventListener("dblclick", function () { drawTimeline(0, D.tmax); });
    var rng = document.getElementById("timeline-range");
    if (rng) rng.textContent = "showing " + fmtT(t0, d) + " to " + fmtT(t1, d) + " of " + fmtT(D.tmax, 6) +
      (D.vmm_total > D.vmm.length ? " (the first " + D.vmm.length + " of " + D.vmm_total + " pool events marked)" : "");
  }
  // Sleeps and wakes (D.bands, D.moves): a tag asleep is a band of its colour over the plot, from
  // the end of its sleep to the end of its wake, labelled with the tag and the mode; each sleep
  // and wake call (the move of the bytes: given back, copied to or from the host) is a darker
  // band, with a marker above the plot to hover (the plot itself takes the mouse for zooming).
  var TAGCOL = ["#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#f28e2b", "#bab0ac"];
  var tagNames = [], bandLabels = [];
  (function () {
    var seen = {}, add = function (n) { if (!seen[n]) { seen[n] = 1; tagNames.push(n); } };
    for (var i = 0; i < D.bands.length; i++) add(D.bands[i][2]);
    for (i = 0; i < D.moves.length; i++) add(D.moves[i][3]);
  })();
  function tagColour(name) { return TAGCOL[tagNames.indexOf(name) % TAGCOL.length]; }
  function modeName(m) { return D.modes[m] || ("mode " + m); }
  function drawSleeps(svg, t0, t1, sx) {
    bandLabels = [];
    var clip = function (a, b) { return [sx(Math.max(a, t0)), sx(Math.min(b, t1))]; };
    var nb = 0, nm = 0, i;
    for (i = 0; i < D.bands.length; i++) {
      var b = D.bands[i];
      if (b[1] < t0 || b[0] > t1) continue;
      var x = clip(b[0], b[1]), col = tagColour(b[2]);
      var what = b[2] + " asleep (" + modeName(b[3]) + ")";
      el("rect", {x: x[0].toFixed(1), y: YT, width: Math.max(x[1] - x[0], 1).toFixed(1), height: YB - YT, fill: col,
                  "fill-opacity": 0.15, "class": "sleep-band", "data-tag": b[2]}, svg);
      // one row of labels per tag (four at most), so that neighbouring bands' labels do not overlap
      var lab = el("text", {x: (x[0] + 3).toFixed(1), y: YT + 30 + 13 * (tagNames.indexOf(b[2]) % 4),
                            "font-size": 11, "font-weight": "bold",
                            "class": "sleep-label", fill: "#333"}, null, b[2] + " \u00b7 " + modeName(b[3]) + (b[6] ? " (still asleep)" : ""));
      el("title", {}, lab, what);
      bandLabels.push(lab);
      nb++;
    }
    for (i = 0; i < D.moves.length; i++) {
      var m = D.moves[i];
      if (m[1] < t0 || m[0] > t1) continue;
      var xm = clip(m[0], m[1]), cm = tagColour(m[3]), mid = (xm[0] + xm[1]) / 2;
      el("rect", {x: xm[0].toFixed(1), y: YT, width: Math.max(xm[1] - xm[0], 1.5).toFixed(1), height: YB - YT,
                  fill: cm, "fill-opacity": 0.3, "class": "sleep-move"}, svg);
      var sleep = m[2] === 0, pts = sleep ? [mid - 5, 4, mid + 5, 4, mid, 14] : [mid - 5, 14, mid + 5, 14, mid, 4];
      var mk = el("polygon", {points: pts.join(" "), fill: cm, stroke: m[7] ? "#000" : cm, "class": "sleep-marker",
                              "data-tag": m[3]}, svg);
      el("title", {}, mk, (sleep ? "sleep " + m[3] + " (" + modeName(m[4]) + "): device memory given back " +
                           fmtBytes(m[5]) + (m[6] ? ", copied to the host " + fmtBytes(m[6]) : "")
                         : "wake " + m[3] + ": device memory mapped again " + fmtBytes(m[5]) +
                           (m[6] ? ", copied back from the host " + fmtBytes(m[6]) : "")) +
         ", " + (Math.max(m[1] - m[0], 0) / 1e6).toFixed(3) + " ms, done at " + fmtT(m[1], 6) +
         (m[7] ? ", FAILED: " + m[9] : ""));
      nm++;
    }
    svg.setAttribute("data-bands-shown", nb);
    svg.setAttribute("data-moves-shown", nm);
    if (!tagNames.length) return;
    // The legend: a swatch per tag (its bands), and what the darker bands and markers are.
    var lg = el("g", {id: "timeline-legend"}, null), lx = X0 + 6;
    for (i = 0; i < tagNames.length; i++) {
      el("rect", {x: lx, y: YT + 2, width: 12, height: 12, fill: tagColour(tagNames[i]), "fill-opacity": 0.35}, lg);
      var tx = el("text", {x: lx + 16, y: YT + 12, "font-size": 11, "class": "legend-tag"}, lg, tagNames[i] + " asleep");
      lx += 16 + 6.5 * tx.textContent.length + 12;
    }
    el("rect", {x: lx, y: YT + 2, width: 12, height: 12, fill: "#888", "fill-opacity": 0.6}, lg);
    el("text", {x: lx + 16, y: YT + 12, "font-size": 11}, lg,
       "sleep \u25bc / wake \u25b2 (bytes moving)");
    bandLabels.push(lg);
  }
  function svgX(ev) {
    var r = document.getElementById("chart-timeline").getBoundingClientRect();
    return (ev.clientX - r.left) * W / (r.width || W);
  }
  function clampX(x) { return Math.max(X0, Math.min(X1, x)); }
  function tAt(x) { return view[0] + (view[1] - view[0]) * (x - X0) / (X1 - X0); }
  window.addEventListener("mousemove", function (ev) {
    if (drag === null) return;
    var b = clampX(svgX(ev)), sel = document.getElementById("timeline-selection");
    sel.setAttribute("x", Math.min(drag, b)); sel.setAttribute("width", Math.abs(b - drag));
  });
  window.addEventListener("mouseup", function (ev) {
    if (drag === null) return;
    var a = drag, b = clampX(svgX(ev));
    drag = null;
    document.getElementById("timeline-selection").setAttribute("visibility", "hidden");
    if (Math.abs(b - a) < 3) return;
    drawTimeline(tAt(Math.min(a, b)), tAt(Math.max(a, b)));
  });
  var reset = document.getElementById("timeline-reset");
  if (reset) reset.addEventListener("click", function () { drawTimeline(0, D.tmax); });

  // ---------------------------------------------------------------- icicle graph
  var RH = 17;
  function hash(s) { var h = 0; for (var i = 0; i < s.length; i++) h = (h * 31 + s.charCodeAt(i)) | 0; return Math.abs(h); }
  function colour(kind, name) {
    var h = hash(name) % 20;
    if (kind === 1) return "hsl(" + (95 + h) + ",45%," + (52 + h % 8) + "%)";
    if (kind === 2) return "hsl(" + (22 + h) + ",85%," + (58 + h % 8) + "%)";
    if (kind === 3) return "hsl(" + (200 + h) + ",45%," + (64 + h % 8) + "%)";
    if (kind === 4) return "#a0a0a0";
    return "#c8c8c8";
  }
  function drawFlame(zi) {
    var svg = document.getElementById("chart-flame");
    if (!svg || !D.flame) return;
    var F = D.flame, N = F.nodes, z = N[zi], zx = z[0], zw = Math.max(z[1], 1), zd = z[2], maxd = 0;
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    for (var i = 0; i < N.length; i++) {
      var n = N[i], a = Math.max(n[0], zx), b = Math.min(n[0] + n[1], zx + zw);
      if (b <= a) continue;
      var px = (a - zx) / zw * W, pw = (b - a) / zw * W;
      if (pw < 0.5) continue;
      var y = n[2] * RH, name = F.names[n[3]], label = F.labels[n[3]];
      maxd = Math.max(maxd, n[2]);
      var g = el("g", {id: "fg-" + i, "class": "fg"}, svg);
      el("title", {}, g, name + "\n" + fmtBytes(n[1]) + " (" + (100 * n[1] / Math.max(F.total, 1)).toFixed(1) +
         " % of live bytes at the peak)");
      el("rect", {x: px.toFixed(2), y: y, width: Math.max(pw - 0.5, 0.5).toFixed(2), height: RH - 1,
                  fill: colour(n[4], name), "fill-opacity": n[2] < zd ? 0.55 : 1}, g);
      var fit = Math.floor((pw - 6) / 6.6);
      if (fit >= 3)
        el("text", {x: (px + 3).toFixed(1), y: y + 12, "font-size": 11, "font-family": "monospace"}, g,
           label.length > fit ? label.slice(0, fit - 2) + ".." : label);
      g.addEventListener("click", (function (k) { return function () { drawFlame(k); }; })(i));
    }
    var h = (maxd + 1) * RH + 2;
    svg.setAttribute("viewBox", "0 0 " + W + " " + h);
    svg.setAttribute("data-zoom", zi);
  }
  var freset = document.getElementById("flame-reset");
  if (freset) freset.addEventListener("click", function () { drawFlame(0); });

  drawTimeline(0, D.tmax);
  drawFlame(0);

  // ---------------------------------------------------------------- URL parameters
  var q = new URLSearchParams(location.search);
  if (q.get("only")) {
    var secs = document.getElementsByTagName("section");
    for (var i = 0; i < secs.length; i++) if (secs[i].id !== q.get("only")) secs[i].style.display = "none";
    var h1 = document.getElementsByTagName("h1")[0];
    if (h1) h1.style.display = "none";
  }
  if (q.get("zoom")) {
    var zz = q.get("zoom").split(",");
    drawTimeline(parseFloat(zz[0]) * 1e9, parseFloat(zz[1]) * 1e9);
  }
  if (q.get("drag")) {
    var f = q.get("drag").split(","), ov = document.getElementById("timeline-overlay");
    var r = document.getElementById("chart-timeline").getBoundingClientRect(), k = (r.width || W) / W;
    var cy = r.top + (YT + 40) * k;
    var at = function (fr) { return r.left + (X0 + (X1 - X0) * parseFloat(fr)) * k; };
    ov.dispatchEvent(new MouseEvent("mousedown", {bubbles: true, cancelable: true, clientX: at(f[0]), clientY: cy}));
    ov.dispatchEvent(new MouseEvent("mousemove", {bubbles: true, clientX: at(f[1]), clientY: cy}));
    ov.dispatchEvent(new MouseEvent("mouseup", {bubbles: true, clientX: at(f[1]), clientY: cy}));
  }
  if (q.get("click")) {
    var c = document.getElementById(q.get("click"));
    if (c) c.dispatchEvent(new MouseEvent("click", {bubbles: true}));
  }
  if (q.get("reset")) document.getElementById("timeline-reset").click();
})();
