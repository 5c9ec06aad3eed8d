// posenc explorer: draws the numbers posenc computed when it wrote this page.
//
// Nothing here computes an encoding. Each control picks one of the settings the page
// was written with; the arrays for that setting are decoded from the page's data and
// handed to Plotly as they are.
"use strict";

(function () {
  const DATA = JSON.parse(document.getElementById("posenc-data").textContent);
  const ARRAYS = { float32: Float32Array, float64: Float64Array, uint8: Uint8Array };
  const decoded = new Map();
  const CONFIG = { displaylogo: false, responsive: true };

  // The array stored as blob `index`: {values: a typed array, shape}.
  function blob(index) {
    if (!decoded.has(index)) {
      const { dtype, shape, data } = DATA.blobs[index];
      const text = atob(data);
      const bytes = new Uint8Array(text.length);
      for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
      decoded.set(index, { values: new ARRAYS[dtype](bytes.buffer), shape });
    }
    return decoded.get(index);
  }

  // A plain array of `values`, NaN as null (drawn as a gap).
  function plain(values) {
    return Array.from(values, (v) => (Number.isNaN(v) ? null : v));
  }

  // The first `count` rows of a 2-D blob, as arrays.
  function rows(array, count) {
    const width = array.shape[1];
    const out = [];
    for (let i = 0; i < count; i++) {
      out.push(plain(array.values.subarray(i * width, (i + 1) * width)));
    }
    return out;
  }

  // Column `j` of the first `count` rows of a 2-D blob.
  function column(array, j, count) {
    const width = array.shape[1];
    const out = new Array(count);
    for (let i = 0; i < count; i++) out[i] = array.values[i * width + j];
    return out;
  }

  function range(count, start = 0) {
    return Array.from({ length: count }, (_, i) => i + start);
  }

  function value(id) {
    return document.getElementById(id).value;
  }

  function show(id, text) {
    document.getElementById(id).textContent = text;
  }

  function fill(select, options, chosen) {
    const element = document.getElementById(select);
    for (const option of options) {
      const item = document.createElement("option");
      item.value = String(option);
      item.textContent = String(option);
      item.selected = String(option) === String(chosen);
      element.appendChild(item);
    }
  }

  function draw(id, traces, layout) {
    const base = { margin: { t: 48, r: 16, b: 48, l: 64 }, font: { size: 12 } };
    Plotly.react(id, traces, Object.assign(base, layout), CONFIG);
  }

  // --- Sinusoidal encoding: the matrix and one position's vector -------------------
  const SIN = DATA.sinusoidal;

  function sinusoidalTable() {
    return blob(SIN.table[`${value("sin-d")}/${value("sin-n")}`]);
  }

  function drawMatrix() {
    const table = sinusoidalTable();
    const length = Number(value("sin-length"));
    const position = document.getElementById("sin-position");
    position.max = String(length - 1);
    if (Number(position.value) > length - 1) position.value = String(length - 1);
    const picked = Number(position.value);
    show("sin-length-shown", length);
    show("sin-position-shown", picked);
    const d = table.shape[1];
    const n = value("sin-n");
    draw("sin-matrix", [{ type: "heatmap", z: rows(table, length), zmin: -1, zmax: 1,
      colorscale: "RdBu", reversescale: true, colorbar: { title: { text: "P(k, j)" } } }], {
      title: { text: `P(k, 2i) = sin(k / ${n}^(2i/${d})), P(k, 2i+1) = cos(...)` },
      xaxis: { title: { text: "column j" } },
      yaxis: { title: { text: "position k" }, autorange: "reversed" },
    });
    draw("sin-vector", [{ type: "scatter", mode: "lines+markers", x: range(d),
      y: plain(table.values.subarray(picked * d, (picked + 1) * d)), name: `k = ${picked}` }], {
      title: { text: `The vector of position k = ${picked} (d_model = ${d}, n = ${n})` },
      xaxis: { title: { text: "column j" } },
      yaxis: { title: { text: "P(k, j)" }, range: [-1.1, 1.1] },
    });
  }

  // --- Columns against position, and the dot product against offset ----------------
  function columnsTable() {
    return blob(SIN.table[`${value("col-d")}/${value("col-n")}`]);
  }

  // The column indices typed in, or a message saying what is valid.
  function chosenColumns(d) {
    const text = value("col-columns").trim();
    const parts = text === "" ? [] : text.split(/[\s,]+/);
    const columns = [];
    for (const part of parts) {
      const j = Number(part);
      if (!/^\d+$/.test(part) || j >= d) {
        return { error: `columns must be integers from 0 to ${d - 1}, got "${part}"` };
      }
      if (!columns.includes(j)) columns.push(j);
    }
    if (columns.length === 0 || columns.length > 12) {
      return { error: `give 1 to 12 columns from 0 to ${d - 1}, got ${columns.length}` };
    }
    return { columns };
  }

  function drawColumns() {
    const key = `${value("col-d")}/${value("col-n")}`;
    const table = columnsTable();
    const d = table.shape[1];
    const length = table.shape[0];
    const chosen = chosenColumns(d);
    show("col-error", chosen.error || "");
    if (chosen.error) {
      Plotly.purge("col-lines"); // no drawing of other settings under these controls
    } else {
      draw("col-lines", chosen.columns.map((j) => ({ type: "scatter", mode: "lines",
        x: range(length), y: column(table, j, length),
        name: `column ${j} (${j % 2 ? "cos" : "sin"}, i = ${Math.floor(j / 2)})` })), {
        title: { text: `Columns against position (d_model = ${d}, n = ${value("col-n")})` },
        xaxis: { title: { text: "position k" } },
        yaxis: { title: { text: "P(k, j)" }, range: [-1.1, 1.1] },
      });
    }
    const offsets = blob(SIN.offsets);
    draw("col-dot", [{ type: "scatter", mode: "lines", x: plain(offsets.values),
      y: plain(blob(SIN.dot[key]).values), name: "PE(p) · PE(p + k)" }], {
      title: { text: "PE(p) · PE(p + k): the same for every p, a function of the offset k" },
      xaxis: { title: { text: "offset k" } },
      yaxis: { title: { text: "dot product" } },
    });
  }

  // --- RoPE: wavelength of each pair, and the score against distance ---------------
  const ROPE = DATA.rope;

  function ropeMethods() {
    return ROPE.methods.filter((m) => document.getElementById(`rope-method-${m}`).checked);
  }

  function drawRope() {
    const factor = Number(value("rope-factor"));
    const original = Number(value("rope-original"));
    const key = `${value("rope-base")}/${factor}/${original}`;
    const methods = ropeMethods();
    const pairs = range(ROPE.head_dim / 2);
    const traces = methods.map((m) => {
      const attention = ROPE.case[key][m].attention;
      const label = attention === 1 ? m : `${m} (attention × ${attention.toPrecision(4)})`;
      return { type: "scatter", mode: "lines", x: pairs, name: label,
        y: plain(blob(ROPE.case[key][m].wavelength).values) };
    });
    for (const [length, text] of [[original, "L₀"], [factor * original, "factor · L₀"]]) {
      traces.push({ type: "scatter", mode: "lines", x: [0, pairs.length - 1],
        y: [length, length], name: `${text} = ${length.toLocaleString("en")}`,
        line: { dash: "dot", color: "grey", width: 1 } });
    }
    draw("rope-wavelength", traces, {
      title: { text: `Wavelength 2π/θ_i of each pair (head_dim ${ROPE.head_dim}, base ${value("rope-base")})` },
      xaxis: { title: { text: "frequency pair i" } },
      yaxis: { title: { text: "wavelength (positions)" }, type: "log" },
    });
    const distances = plain(blob(ROPE.distances).values);
    draw("rope-score", methods.map((m) => ({ type: "scatter", mode: "lines", name: m,
      x: distances, y: plain(blob(ROPE.case[key][m].score).values) })), {
      title: { text: "Score q_rot(m) · k_rot(n) of all-ones q, k: 2 Σ cos(Δ θ_i)" },
      xaxis: { title: { text: "distance Δ = m − n (log scale)" }, type: "log" },
      yaxis: { title: { text: "score" } },
    });
  }

  // --- ALiBi: the slopes, and one head's bias ---------------------------------------
  const ALIBI = DATA.alibi;

  function drawAlibi() {
    const heads = Number(value("alibi-heads"));
    const head = document.getElementById("alibi-head");
    head.max = String(heads - 1);
    if (Number(head.value) > heads - 1) head.value = String(heads - 1);
    const h = Number(head.value);
    const mode = value("alibi-mode");
    show("alibi-heads-shown", heads);
    show("alibi-head-shown", h);
    const slopes = blob(ALIBI.slopes[String(heads)]).values;
    draw("alibi-slopes", [{ type: "bar", x: range(heads), y: plain(slopes),
      marker: { color: range(heads).map((i) => (i === h ? "#d62728" : "#1f77b4")) } }], {
      title: { text: `Slopes m_h of ${heads} head${heads > 1 ? "s" : ""} (log scale)` },
      xaxis: { title: { text: "head h" } },
      yaxis: { title: { text: "m_h" }, type: "log", exponentformat: "power" },
    });
    const bias = blob(ALIBI.bias[`${mode}/${heads}`][h]);
    draw("alibi-bias", [{ type: "heatmap", z: rows(bias, ALIBI.positions),
      colorscale: "Viridis", colorbar: { title: { text: "bias" } } }], {
      title: { text: mode === "causal"
        ? `Head ${h}: −m·(i − j), m = ${slopes[h]} (future keys masked)`
        : `Head ${h}: −m·|i − j|, m = ${slopes[h]}` },
      xaxis: { title: { text: "key position j" } },
      yaxis: { title: { text: "query position i" }, autorange: "reversed",
        scaleanchor: "x" },
    });
  }

  // --- T5: the bucket matrix and the bucket rule -------------------------------------
  const T5 = DATA.t5;

  function drawT5() {
    const key = `${value("t5-buckets")}/${value("t5-distance")}/${value("t5-direction")}`;
    const found = T5.case[key];
    show("t5-error", found.error || "");
    document.getElementById("t5-plots").hidden = Boolean(found.error);
    if (found.error) return;
    const matrix = blob(found.matrix);
    draw("t5-matrix", [{ type: "heatmap", z: rows(matrix, T5.positions),
      colorscale: "Viridis", colorbar: { title: { text: "bucket" } } }], {
      title: { text: `Bucket of key j for query i (${value("t5-buckets")} buckets)` },
      xaxis: { title: { text: "key position j" } },
      yaxis: { title: { text: "query position i" }, autorange: "reversed",
        scaleanchor: "x" },
    });
    draw("t5-curve", [{ type: "scatter", mode: "lines", line: { shape: "hv" },
      x: plain(blob(found.distances).values), y: plain(blob(found.buckets).values),
      name: "bucket" }], {
      title: { text: `Bucket against key − query (max_distance ${value("t5-distance")})` },
      xaxis: { title: { text: "relative position key − query" } },
      yaxis: { title: { text: "bucket" } },
    });
  }

  // --- Controls ---------------------------------------------------------------------
  function listen(ids, redraw) {
    for (const id of ids) {
      const element = document.getElementById(id);
      element.addEventListener("input", redraw);
      element.addEventListener("change", redraw);
    }
  }

  fill("sin-d", SIN.d_model, 128);
  fill("sin-n", SIN.base, 10000);
  fill("col-d", SIN.d_model, 16);
  fill("col-n", SIN.base, 100);
  fill("rope-base", ROPE.base, 500000);
  fill("rope-factor", ROPE.factor, 8);
  fill("rope-original", ROPE.original_max_position_embeddings, 8192);
  fill("alibi-mode", ALIBI.mode, "causal");
  fill("t5-buckets", T5.num_buckets, 32);
  fill("t5-distance", T5.max_distance, 128);
  const length = document.getElementById("sin-length");
  length.max = String(SIN.positions);
  length.value = String(SIN.positions);
  const heads = document.getElementById("alibi-heads");
  heads.max = String(ALIBI.num_heads[ALIBI.num_heads.length - 1]);
  heads.min = String(ALIBI.num_heads[0]);
  const leftOut = Object.entries(ROPE.left_out).map(([m, why]) => `${m}: ${why}`);
  show("rope-left-out", leftOut.length ? `Not drawn: ${leftOut.join("; ")}` : "");
  const methods = document.getElementById("rope-methods");
  for (const m of ROPE.methods) {
    const label = document.createElement("label");
    const box = document.createElement("input");
    box.type = "checkbox";
    box.id = `rope-method-${m}`;
    box.checked = ROPE.shown.includes(m);
    label.append(box, ` ${m}`);
    methods.appendChild(label);
  }

  listen(["sin-d", "sin-n", "sin-length", "sin-position"], drawMatrix);
  listen(["col-d", "col-n", "col-columns"], drawColumns);
  listen(["rope-base", "rope-factor", "rope-original",
    ...ROPE.methods.map((m) => `rope-method-${m}`)], drawRope);
  listen(["alibi-heads", "alibi-head", "alibi-mode"], drawAlibi);
  listen(["t5-buckets", "t5-distance", "t5-direction"], drawT5);

  drawMatrix();
  drawColumns();
  drawRope();
  drawAlibi();
  drawT5();
})();
